"""The confusion matrix as a table, as Ultralytics' ConfusionMatrix exports it: summary() is one dict per predicted class
(`Predicted`: its name, then one column per true class, `background` last), to_csv() / to_json() the same as text, and
to_df() a pandas DataFrame (Ultralytics 8.4: polars; pandas is not a dependency of yolo-cb: pip install pandas)."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import numpy as np


def column_names(names: dict[int, str], nc: int) -> list[str]:
    """The class names then 'background', each made a plain identifier (letters, digits, '_') and unique ignoring case
    (a repeated one gets _1, _2, ...), as the columns of Ultralytics' summary()."""
    columns, taken = [], set()
    for raw in [*(str(names.get(i, i)) for i in range(nc)), "background"]:
        base = re.sub(r"[^a-zA-Z0-9_]", "_", raw)
        name, n = base, 1
        while name.lower() in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name.lower())
        columns.append(name)
    return columns


class ConfusionTable:
    """summary / to_csv / to_json / to_df over `matrix` ((nc + 1) x (nc + 1): rows predicted, columns true), `names`, `nc`."""

    matrix: np.ndarray
    names: dict[int, str]
    nc: int

    def summary(self, normalize: bool = False, decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per predicted class: {"Predicted": name, <true class>: count, ..., "background": count}; normalize=True
        divides each column by its true class's total."""
        columns = column_names(self.names, self.nc)
        values = self.matrix / ((self.matrix.sum(0, keepdims=True) + 1e-9) if normalize else 1)
        values = values.round(decimals)
        return [{"Predicted": row_name, **{c: values[i, j].item() for j, c in enumerate(columns)}} for i, row_name in enumerate(columns)]

    def to_csv(self, normalize: bool = False, decimals: int = 5) -> str:
        rows = self.summary(normalize, decimals)
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()

    def to_json(self, normalize: bool = False, decimals: int = 5) -> str:
        return json.dumps(self.summary(normalize, decimals), indent=2)

    def to_df(self, normalize: bool = False, decimals: int = 5):
        try:
            import pandas
        except ImportError as error:
            raise ImportError("confusion_matrix.to_df() needs pandas: pip install pandas (summary(), to_csv() and to_json() "
                              "need nothing)") from error
        return pandas.DataFrame(self.summary(normalize, decimals))

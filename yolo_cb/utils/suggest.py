"""'Did you mean ...?' hints for misspelt names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The up-to-n valid names closest to `name`."""
    return difflib.get_close_matches(str(name), list(choices), n=n, cutoff=0.5)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x' or 'y'?' or '' when nothing is close."""
    matches = closest(name, choices)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"

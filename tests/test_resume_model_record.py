"""model= on resume is compared with the checkpoint's whole architecture record (issue 26): a YAML that differs only in
reg_max is another model, refused with one line; the checkpoint's own YAML is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_resume_safety import SMALL, cli, kv, write_data

from yolo_cb.utils.paths import find_model_cfg

pytestmark = pytest.mark.slow


def test_a_model_yaml_differing_only_in_reg_max_is_refused_on_resume(tmp_path, shapes_dir):
    data = write_data(tmp_path / "data", shapes_dir)
    first = cli(tmp_path, *kv({**SMALL, "data": data, "epochs": 2, "project": tmp_path / "runs", "name": "exp", "model": "yolocb-n.yaml",
                               "callbacks": "on_fit_epoch_end=cbpkg:stop_now"}))
    assert first.returncode == 0, first.stderr[-3000:]
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    other = yaml.safe_load(Path(find_model_cfg("yolocb-n.yaml")).read_text())
    other["reg_max"] = 8
    (tmp_path / "yolocb-n-reg8.yaml").write_text(yaml.safe_dump(other))
    refused = cli(tmp_path, f"resume={last}", f"model={tmp_path / 'yolocb-n-reg8.yaml'}", "callbacks=")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert "cannot change model=" in refused.stderr and "Traceback" not in refused.stderr

"""A model YAML key that its family's detector does not read is refused in one line, naming the keys it does read: before,
`depthwise: true` in a yolocb YAML (or `cls_branch:` in a yolox one, or a misspelt key) built a model silently without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from yolo_cb.errors import ConfigError
from yolo_cb.nn import build_model
from yolo_cb.nn.build import load_model_cfg
from yolo_cb.utils.paths import MODELS_DIR, find_model_cfg

ROOT = Path(__file__).resolve().parents[1]


def _with(tmp_path: Path, bundled: str, **extra) -> Path:
    data = {**yaml.safe_load(find_model_cfg(bundled).read_text()), **extra}
    path = tmp_path / f"my-{bundled}"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("bundled, key, says", [
    ("yolocb-n.yaml", {"depthwise": True}, "unknown key 'depthwise' for a yolocb model"),
    ("yolox-nano.yaml", {"cls_branch": "depthwise"}, "unknown key 'cls_branch' for a yolox model"),
    ("yolocb-n.yaml", {"reg_maxx": 8}, "unknown key 'reg_maxx' for a yolocb model (it would be ignored). Did you mean 'reg_max'"),
])
def test_a_key_the_family_does_not_read_is_one_line(tmp_path, bundled, key, says):
    with pytest.raises(ConfigError, match=r"^[^\n]+$") as error:
        build_model(_with(tmp_path, bundled, **key), nc=3, verbose=False)
    assert says in str(error.value) and "model YAML takes:" in str(error.value) and "width" in str(error.value)


def test_every_bundled_model_yaml_holds_only_keys_its_family_reads():
    for path in sorted(MODELS_DIR.glob("*.yaml")):
        arch, _ = load_model_cfg(path)
        assert arch["depth"] > 0, path.name


def test_the_cli_refuses_it_before_any_work_exit_2(tmp_path, shapes_small_yaml):
    model = _with(tmp_path, "yolocb-n.yaml", depthwise=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    short = ["epochs=1", "imgsz=64", "workers=0", "val=False", "plots=False", "onnx_check=False", "mlflow=False", "tensorboard=False"]
    done = subprocess.run([sys.executable, "-m", "yolo_cb", "train", f"model={model}", f"data={shapes_small_yaml}", *short,
                           f"project={tmp_path / 'runs'}"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    said = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and said.count("\n") == 0 and said.startswith("yolo-cb: error:"), said[-1500:]
    assert "unknown key 'depthwise' for a yolocb model" in said
    assert not (tmp_path / "runs").exists()

"""What the command line and the files it names decide is answered before torch is imported (issue 62).

A missing or malformed data YAML, a missing cfg= file, a bad key or value, `--help` and `yolo-cb callbacks` each
answer in a fresh process that never imports torch (nor the integrations' heavy parts): one process runs the whole
table of inputs, entrypoint by entrypoint, and reports each exit status, its one line and whether torch was loaded by
then; one more runs the real `yolo-cb` console script as a whole process, its imports listed by Python itself
(PYTHONPROFILEIMPORTTIME).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

# Runs `entrypoint(argv)` for each argv of the JSON list in argv[1]; prints, as JSON, each one's exit status, output and
# whether torch had been imported once it returned.
CHILD = r"""
import contextlib, io, json, sys
from yolo_cb.cli import entrypoint

rows = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            entrypoint(argv)
            code = 0
        except SystemExit as exit:
            code = exit.code
    rows.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "torch": "torch" in sys.modules})
print(json.dumps(rows))
"""

DATA_FILES = {  # a data YAML of each malformed kind, and the one line that refuses it
    "syntax.yaml": ("names: [a, b\ntrain: images\n", "not valid YAML"),
    "list.yaml": ("- train\n- val\n", "expected a mapping with train/val/names keys"),
    "no_names.yaml": ("train: images/train\nval: images/val\n", "required key 'names' is missing or empty"),
    "no_val.yaml": ("train: images/train\nnames: [a, b]\n", "required key 'val' is missing or empty"),
    "nc.yaml": ("train: images/train\nval: images/val\nnames: [a, b]\nnc: 3\n", "'nc' is 3 but 'names' has 2 entries"),
    "ids.yaml": ("train: images/train\nval: images/val\nnames: {0: a, 2: b}\n", "'names' is {0: 'a', 2: 'b'}; its ids must be 0..1 without gaps"),
}


def refusals(folder: Path) -> list[tuple[list[str], str]]:
    """(argv, the one line it must print) for every refusal the command line and its files decide."""
    table = [(["train", f"data={folder / name}"], says) for name, (_, says) in DATA_FILES.items()]
    return table + [
        (["train", "data=missing.yaml"], "dataset config 'missing.yaml' not found"),
        (["val", "model=best.pt", "data=missing.yaml"], "dataset config 'missing.yaml' not found"),  # before the weights load
        (["tune", "data=missing.yaml"], "dataset config 'missing.yaml' not found"),
        (["train", "cfg=custom.yaml"], "no_such_data.yaml' not found"),  # data= named by the cfg= file
        (["train", "cfg=missing_cfg.yaml"], "cfg=missing_cfg.yaml: file not found"),
        (["train", "bogus=1"], "'bogus' is not a valid yolo-cb argument"),
        (["train", "epochs=abc"], "invalid value for 'epochs'"),
        (["train", "export_check=onnx,onnx_bogus"], "'onnx_bogus' is not an export variant"),  # once a warning after setup
        (["train", "export_check=openvino_half_int8"], "half=True and int8=True exclude each other"),
    ]


def run_table(argvs: list[list[str]], cwd: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argvs)], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_refusals_help_and_callbacks_answer_before_torch_is_imported(tmp_path):
    for name, (text, _) in DATA_FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "custom.yaml").write_text("data: no_such_data.yaml\nepochs: 1\n")
    written = sorted(tmp_path.iterdir())
    table = refusals(tmp_path)
    rows = run_table([argv for argv, _ in table] + [["callbacks"], ["--help"]], tmp_path)
    for (argv, says), row in zip(table, rows[: len(table)], strict=True):
        lines = row["stderr"].splitlines()
        assert row["code"] == 2 and len(lines) == 1 and lines[0].startswith("yolo-cb: error:"), (argv, row)
        assert says in lines[0], (argv, lines[0])
        assert not row["torch"], f"yolo-cb {' '.join(argv)} imported torch before it refused"
    callbacks, help_ = rows[len(table):]
    assert callbacks["code"] == 0 and not callbacks["torch"], callbacks
    assert callbacks["stdout"].startswith("event ") and "progress" in callbacks["stdout"] and "on_train_epoch_start" in callbacks["stdout"]
    assert help_["code"] == 0 and not help_["torch"] and help_["stdout"].startswith("yolo-cb: train, validate"), help_
    assert sorted(tmp_path.iterdir()) == written  # nothing made: no run folder, no datasets folder, no download


def test_the_console_script_refuses_a_missing_data_yaml_before_torch_loads(tmp_path):
    script = Path(sys.executable).parent / "yolo-cb"
    if not script.is_file():
        pytest.skip(f"no yolo-cb console script beside {sys.executable} (the package is not installed in this environment)")
    done = subprocess.run([str(script), "train", "data=missing.yaml"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**ENV, "PYTHONPROFILEIMPORTTIME": "1"})  # Python lists every import on stderr
    imports = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and said == [said[0]] and said[0].startswith("yolo-cb: error: dataset config 'missing.yaml' not found"), said
    assert any(re.search(r"\|\s*yolo_cb\.cli$", line) for line in imports)  # the listing is there, and shows our CLI
    loaded = [line for line in imports if re.search(r"\|\s*(torch|torchvision|cv2|onnx|onnxruntime|mlflow)(\.|$)", line)]
    assert not loaded, loaded


def test_a_data_yaml_that_downloads_is_not_fetched_by_the_early_check(tmp_path):
    """The check before torch reads the YAML only: images missing with `download:` (here an address nobody serves) is for
    the run to fetch; nothing is fetched, created or generated by the check."""
    from yolo_cb.data.dataset_yaml import read_dataset

    data = tmp_path / "remote.yaml"
    data.write_text("path: remote\ntrain: images/train\nval: images/val\nnames: [a]\ndownload: http://127.0.0.1:9/remote.zip\n")
    found = read_dataset(data, tmp_path / "datasets")
    assert found.names == {0: "a"} and found.places[-1][0] == (tmp_path / "datasets" / "remote").resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote.yaml"]

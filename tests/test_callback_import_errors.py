"""A callbacks= module that fails at import (SyntaxError, an error it raises) is one line, exit 2, naming the module and
the error, before any work (issue 26)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MODULES = {"raises_at_import": "raise RuntimeError('no GPU found by my setup code')\ndef fn(trainer):\n    pass\n",
           "broken_syntax": "def fn(trainer)\n    pass\n"}


@pytest.mark.parametrize("module, words", [("raises_at_import", ("RuntimeError", "no GPU found")),
                                           ("broken_syntax", ("SyntaxError", "broken_syntax.py", "line 1"))])
def test_a_callback_module_failing_at_import_is_one_line(tmp_path, module, words):
    (tmp_path / f"{module}.py").write_text(MODULES[module])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "yolo_cb", "train", f"callbacks=on_train_start={module}:fn",
                             f"project={tmp_path / 'runs'}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr and f"'{module}'" in line and all(w in line for w in words), result.stderr[-3000:]
    assert not (tmp_path / "runs").exists()

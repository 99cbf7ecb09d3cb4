# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned here for this machine's local wheel store; pyproject keeps ranges for users.
TORCH := torch==2.14.1 torchvision==0.29.1
# test processes side by side (pytest-xdist): the suite's processes use one thread each (tests/conftest.py), so two
# keep both cores of a 2-core machine busy (whole suite in a clean clone: 830 s; three processes: 948 s; the longest
# files first: 928 s); a file's tests stay in one process (its module fixtures are built once)
TEST_JOBS ?= 2

.PHONY: venv demo test bench lint clean

$(BIN)/yolo-cb: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/yolo-cb

venv: $(BIN)/yolo-cb

demo: venv
	$(BIN)/python scripts/demo.py

test: venv
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

bench: venv
	$(BIN)/python benchmarks/callbacks.py
	$(BIN)/python benchmarks/dataloader.py
	$(BIN)/python benchmarks/inference.py
	$(BIN)/python benchmarks/train_step.py
	$(BIN)/python benchmarks/convergence.py

lint: venv
	$(BIN)/ruff check yolo_cb tests benchmarks

clean:
	rm -rf runs build dist *.egg-info

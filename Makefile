# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned here for this machine's local wheel store; pyproject keeps ranges for users.
TORCH := torch==2.14.1 torchvision==0.29.1
# the `track` extra's tracker (tests/test_video_track.py) and what it imports, pinned as tested; its own requirements add
# opencv-python, a second cv2 beside opencv-python-headless, so they are installed without it (users: pip install 'yolo-cb[track]')
TRACKERS := trackers==2.6.1 supervision==0.31.2 av defusedxml pydeprecate==0.13.0
# test processes side by side (pytest-xdist): the suite's processes use one thread each (tests/conftest.py), so two
# keep both cores of a 2-core machine busy (whole suite in a clean clone: 830 s; three processes: 948 s; the longest
# files first: 928 s); a file's tests stay in one process (its module fixtures are built once)
TEST_JOBS ?= 2

.PHONY: venv demo test test-isa test-export-extras bench lint clean

$(BIN)/yolo-cb: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile $(TORCH)  # no byte-compiling torch's ~3,000 modules: a process compiles the few it imports
	$(BIN)/pip install -q -e '.[dev]'  # byte-compiled here: PYTHONDONTWRITEBYTECODE=1 on these machines, so no process caches it later
	$(BIN)/pip install -q --no-deps $(TRACKERS)  # the track extra without its opencv-python, which would overwrite our headless cv2
	touch $(BIN)/yolo-cb

venv: $(BIN)/yolo-cb

demo: venv
	$(BIN)/python scripts/demo.py

test: venv
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=15  # the 15 slowest: the next slow test shows when it lands

# The tests whose figures come from trained models or reference outputs, run as other CPU kinds would run them: each
# ISA_KINDS entry is oneDNN's ceiling (ONEDNN_MAX_CPU_ISA: AVX, AVX2, AVX512_CORE, AVX512_CORE_BF16, ...; SSE41 makes
# OpenVINO's CPU plugin refuse every model ("bad combination"); a ceiling
# above what the CPU has changes nothing) and whether bf16 autocast counts as native (YOLO_CB_CPU_BF16: 1 trains under
# bf16 as a CPU with AVX512-BF16 or AMX does, emulated where the CPU has none; 0 trains in fp32 as any other CPU).
ISA_TESTS := tests/test_export_formats.py tests/test_cli_journey.py tests/test_overfit.py tests/test_resume_and_checkpoints.py \
	tests/test_pretrained.py tests/test_loss_parity.py tests/test_amp_cpu.py tests/test_early_stop_restore.py tests/test_metrics.py
ISA_KINDS ?= AVX:0 AVX2:1

test-isa: venv
	for kind in $(ISA_KINDS); do isa=$${kind%%:*}; bf16=$${kind##*:}; echo "== ONEDNN_MAX_CPU_ISA=$$isa YOLO_CB_CPU_BF16=$$bf16"; \
		ONEDNN_MAX_CPU_ISA=$$isa YOLO_CB_CPU_BF16=$$bf16 $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile $(ISA_TESTS) || exit 1; done

# The export formats whose toolchains are too heavy for `make test`'s install budget (LiteRT: litert-torch brings jax and
# transformers; ExecuTorch: torchao, pandas, scikit-learn): installed into a venv of their own, layered over .venv (a .pth
# there adds .venv's packages, so torch is not installed twice), and their tests run there. In .venv they are skipped.
EXPORT_VENV := .venv-export
EXPORT_EXTRAS := litert,executorch

$(EXPORT_VENV)/.installed: $(BIN)/yolo-cb
	test -x $(EXPORT_VENV)/bin/python || $(BIN)/python -m venv $(EXPORT_VENV)
	$(BIN)/python -c "import site; print(f'import site; site.addsitedir({site.getsitepackages()[0]!r})')" \
		> "$$($(EXPORT_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/yolo_cb_base_venv.pth"
	$(EXPORT_VENV)/bin/pip install -q --upgrade pip
	$(EXPORT_VENV)/bin/pip install -q --no-compile -e '.[$(EXPORT_EXTRAS)]'
	touch $@

# LiteRT and ExecuTorch, and the precision variants of ncnn and MNN (fp16, int8 weights) that make test leaves out
test-export-extras: $(EXPORT_VENV)/.installed
	YOLO_CB_EXPORT_EXTRAS=1 $(EXPORT_VENV)/bin/python -m pytest -q tests/test_export_formats.py -k "tflite or executorch or ncnn_half or mnn_half or mnn_int8"

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

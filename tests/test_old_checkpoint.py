"""Checkpoints written by older yolo-cb (commits a1e3525, 4f22c48, 7f3d9f3 and 7d42114, tests/fixtures/README.md) still load and resume."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from fixtures.make_4f22c48_compat import lists, one_set, two_sets, write_yaml
from test_resume_safety import cli, write_data

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint, model_from_checkpoint
from yolo_cb.data.resolve import check_data
from yolo_cb.nn import YOLOCB
from yolo_cb.recipe.ema import unwrap
from yolo_cb.recipe.stop import StopCause
from yolo_cb.training.resume import ResumeError, check_same_dataset, dataset_fingerprint
from yolo_cb.utils.signal_stack import kept_signal_stack

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "a1e3525_tiny_last.pt"


def test_a_checkpoint_of_a1e3525_loads_without_a_checksum():
    assert "tensors_crc32" not in torch.load(FIXTURE, weights_only=True)
    ckpt = load_checkpoint(FIXTURE)
    assert ckpt.epoch == 0 and ckpt.finished is False
    model = model_from_checkpoint(ckpt)
    assert model(torch.zeros(1, 3, 64, 64)).shape[-1] == 5 + len(ckpt.names)


def test_a_checkpoint_of_a1e3525_resumes_to_the_end(tmp_path, shapes_dir):
    data = write_data(tmp_path / "data", shapes_dir)  # the same 8 / 4 shapes images it was trained on
    ckpt = torch.load(FIXTURE, weights_only=True)
    ckpt["train_args"]["data"] = str(data)  # its recorded YAML lies on the machine that wrote it
    old = tmp_path / "old" / "last.pt"
    old.parent.mkdir()
    torch.save(ckpt, old)  # as a1e3525 wrote it: no checksum
    done = cli(tmp_path, f"resume={old}", f"project={tmp_path / 'runs'}", "name=resumed")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    written = tmp_path / "runs" / "resumed" / "weights" / "last.pt"
    assert isinstance(torch.load(written, weights_only=True)["tensors_crc32"], int)
    last = load_checkpoint(written)
    assert last.epoch == 1 and last.finished is True and last.model_cfg["width"] == 0.0625


# --- a YOLOCB checkpoint written before its layers were one indexed list (backbone.*, neck.*, head.*) ------------------
YOLOCB_FIXTURE = FIXTURE.parent / "4f22c48_yolocb_tiny_last.pt"
YOLOCB_OUTPUT = FIXTURE.parent / "4f22c48_yolocb_tiny_out.pt"  # its EMA model's eval output, computed by 4f22c48


def fixed_input() -> torch.Tensor:
    return torch.linspace(0, 1, 3 * 64 * 64).reshape(torch.load(YOLOCB_OUTPUT, weights_only=True)["input_linspace"])


def same_as_4f22c48(output) -> bool:
    written = torch.load(YOLOCB_OUTPUT, weights_only=True)["output"]
    output = torch.as_tensor(output[0] if isinstance(output, (list, tuple)) else output).float()
    return output.shape == written.shape and torch.allclose(output, written, rtol=1e-4, atol=1e-5)


def test_a_yolocb_checkpoint_of_4f22c48_loads_under_the_indexed_names_with_the_same_outputs():
    written = torch.load(YOLOCB_FIXTURE, weights_only=True)
    assert next(iter(written["model"])) == "backbone.stem.conv.weight"  # the names it was written with
    ckpt = load_checkpoint(YOLOCB_FIXTURE)  # read as today's names
    assert all(k.startswith("model.") for k in (*ckpt.model, *ckpt.ema)) and "model.11.cls_branches.2.2.bias" in ckpt.ema
    model = model_from_checkpoint(ckpt)
    with torch.no_grad():
        assert same_as_4f22c48(model(fixed_input()))
    fresh = YOLOCB(**{k: v for k, v in ckpt.model_cfg.items() if k != "family"}).eval()
    fresh.load_state_dict(written["ema"])  # the old keys straight into load_state_dict (its pre-hook maps them)
    with torch.no_grad():
        assert torch.equal(fresh(fixed_input()), model(fixed_input()))


def test_a_yolocb_checkpoint_of_4f22c48_resumes_to_the_end(tmp_path, shapes_dir, caplog):
    data = write_data(tmp_path / "data", shapes_dir)  # the same 8 / 4 shapes images it was trained on
    ckpt = torch.load(YOLOCB_FIXTURE, weights_only=True)
    ckpt["train_args"].update(data=str(data), freeze=["backbone.stem"])  # an old module name in its settings too
    old = tmp_path / "old" / "last.pt"
    old.parent.mkdir()
    torch.save(ckpt, old)
    YOLO(str(old)).train(resume=True, project=str(tmp_path / "runs"), name="resumed")
    # its early_stopping callback's state (a second best, before early stopping was a step of the loop) is read, not warned about
    assert "callback 'early_stopping'" not in caplog.text and "early_stopping" in ckpt["callbacks"]
    last = load_checkpoint(tmp_path / "runs" / "resumed" / "weights" / "last.pt")
    assert last.epoch == 1 and last.finished is True and next(iter(last.model)) == "model.0.conv.weight"
    stats = {k: v for k, v in load_checkpoint(YOLOCB_FIXTURE).model.items() if k.endswith("running_mean")}
    for key, value in stats.items():  # BatchNorm statistics moved in every layer but the stem, frozen as backbone.stem
        assert torch.equal(value, last.model[key]) == key.startswith("model.0."), key


def test_a_yolocb_checkpoint_of_4f22c48_exports_to_graphs_with_its_outputs(tmp_path):
    old = tmp_path / "old.pt"
    old.write_bytes(YOLOCB_FIXTURE.read_bytes())
    x = fixed_input()
    onnx_file = Path(YOLO(str(old)).export(format="onnx", imgsz=64))
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    assert same_as_4f22c48(session.run(None, {session.get_inputs()[0].name: x.numpy()}))
    script = torch.jit.load(YOLO(str(old)).export(format="torchscript", imgsz=64))
    with torch.no_grad():
        assert same_as_4f22c48(script(x))
    openvino = pytest.importorskip("openvino")
    folder = Path(YOLO(str(old)).export(format="openvino", imgsz=64))
    with kept_signal_stack():  # OpenVINO's plugin swaps this process's signal stack (yolo_cb/utils/signal_stack.py)
        compiled = openvino.Core().compile_model(str(next(folder.glob("*.xml"))), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert same_as_4f22c48(compiled(x.numpy())[compiled.output(0)])


# --- 4f22c48 runs that today's layout changed: freeze= (late optimizer groups) and a val: mapping (the fingerprint) -----
FREEZE_FIXTURE = FIXTURE.parent / "4f22c48_yolocb_freeze_last.pt"
TWO_SETS_FIXTURE = FIXTURE.parent / "4f22c48_two_val_sets_last.pt"


def copy_on(fixture: Path, folder: Path, data: Path) -> Path:
    """The fixture as `folder`/last.pt, its recorded data YAML (on the machine that wrote it) pointed at `data`."""
    ckpt = torch.load(fixture, weights_only=True)
    ckpt["train_args"]["data"] = str(data)
    folder.mkdir(parents=True)
    torch.save(ckpt, folder / "last.pt")
    return folder / "last.pt"


def after_each_step(seen: list):
    """on_before_zero_grad: (each tensor's Adam step count, None without state; per tensor its group's LR / its
    followed group's LR), by name."""
    def record(trainer):
        groups, state = trainer.optimizer.param_groups, trainer.optimizer.state
        ratio = {id(p): g["lr"] / groups[g.get("follows", i)]["lr"] for i, g in enumerate(groups) for p in g["params"]}
        named = list(unwrap(trainer.model).named_parameters())
        seen.append(({n: int(state[p]["step"]) if "step" in state.get(p, {}) else None for n, p in named},
                     {n: ratio[id(p)] for n, p in named}))
    return record


def test_a_freeze_run_of_4f22c48_resumes_with_its_optimizer_state_in_todays_groups(tmp_path, shapes_dir):
    """freeze=3 (backbone.stem, .stage2, .stage3), stages {1: [backbone.stem], 2: [backbone.stage2]}, 3 epochs of 2
    optimizer steps, saved after epoch 1 in 4f22c48's 3 groups: the stem's tensors have 2 Adam steps, the unfrozen-from-
    the-start ones 4, stage2 and stage3 none. Today the frozen modules have late groups of their own (unfreeze_warmup)."""
    written = torch.load(FREEZE_FIXTURE, weights_only=True)
    assert len(written["optimizer"]["param_groups"]) == 3 and written["train_args"]["freeze"] == 3
    old = copy_on(FREEZE_FIXTURE, tmp_path / "old", one_set(tmp_path / "data", shapes_dir))
    seen: list = []
    model = YOLO(str(old))
    model.add_callback("on_before_zero_grad", after_each_step(seen))
    model.train(resume=True, callbacks=written["train_args"]["callbacks"], project=str(tmp_path / "runs"), name="resumed")
    last = load_checkpoint(tmp_path / "runs" / "resumed" / "weights" / "last.pt")
    assert last.epoch == 2 and last.finished is True and len(seen) == 2
    layer = {name: name.split(".")[1] for name in seen[0][0]}  # model.<i>.*: 0 stem, 1 stage2, 2 stage3
    # each tensor's state where its position in the old groups says: the stem 2 + 1 steps, the others 4 + 1, stage2 fresh
    expected = {"0": 3, "1": 1, "2": None}
    assert seen[0][0] == {n: expected.get(layer[n], 5) for n in seen[0][0]}
    # the LR as the settings say: the stem trained before (no ramp left), stage2 ramps over 2 batches, stage3 frozen
    for step, ramp in enumerate((0.5, 1.0)):
        wanted = {"0": 1.0, "1": ramp, "2": 0.0}
        assert all(seen[step][1][n] == pytest.approx(wanted.get(layer[n], 1.0)) for n in seen[step][1]), seen[step][1]
    before = load_checkpoint(FREEZE_FIXTURE).model  # under today's names
    for key, value in last.model.items():  # stage3 (model.2) still frozen: bit-identical; stem and stage2 trained
        if key.startswith("model.2."):
            assert torch.equal(value, before[key]), key
    assert all(not torch.equal(last.model[k], before[k]) for k in ("model.0.conv.weight", "model.1.0.conv.weight"))


def test_a_run_of_4f22c48_with_a_mapping_of_two_validation_sets_resumes(tmp_path, shapes_dir):
    written = torch.load(TWO_SETS_FIXTURE, weights_only=True)
    assert written["data_fingerprint"]["val_images"] == 3 and "version" not in written["data_fingerprint"]  # day's only
    old = copy_on(TWO_SETS_FIXTURE, tmp_path / "old", two_sets(tmp_path / "data", shapes_dir))
    YOLO(str(old)).train(resume=True, project=str(tmp_path / "runs"), name="resumed")
    last = load_checkpoint(tmp_path / "runs" / "resumed" / "weights" / "last.pt")
    assert last.epoch == 1 and last.finished is True and {"day/fitness", "night/fitness"} <= set(last.metrics)
    assert last.data_fingerprint["val_images"] == 5 and last.data_fingerprint["version"] == 2  # now every set


@pytest.mark.parametrize("changed", ["day", "train"])
def test_a_4f22c48_checkpoint_of_two_validation_sets_is_refused_on_a_changed_dataset(tmp_path, shapes_dir, changed):
    """What 4f22c48 recorded (train images, the first set's images, names) is still compared: a change is refused."""
    data = two_sets(tmp_path / "data", shapes_dir, day=2 if changed == "day" else 3)
    if changed == "train":
        (tmp_path / "data" / "train.txt").write_text("\n".join(sorted(map(str, (shapes_dir / "images" / "train").glob("*.jpg")))[:6]))
    old = copy_on(TWO_SETS_FIXTURE, tmp_path / "old", data)
    with pytest.raises(ResumeError, match="the dataset changed"):
        YOLO(str(old)).train(resume=True, project=str(tmp_path / "runs"), name="resumed")
    assert not (tmp_path / "runs" / "resumed" / "weights" / "last.pt").exists()


def test_a_fingerprint_is_compared_in_the_form_its_checkpoint_recorded(tmp_path, shapes_dir):
    mapping = check_data(str(two_sets(tmp_path / "a", shapes_dir)))
    today = dataset_fingerprint(mapping)
    assert today["val_images"] == 5 and today["version"] == 2
    check_same_dataset(Checkpoint(data_fingerprint=today), mapping, "new.pt")  # the same data
    night_changed = check_data(str(two_sets(tmp_path / "b", shapes_dir, night=1)))
    with pytest.raises(ResumeError, match="the dataset changed"):  # today's form sees every set
        check_same_dataset(Checkpoint(data_fingerprint=today), night_changed, "new.pt")
    recorded = torch.load(TWO_SETS_FIXTURE, weights_only=True)["data_fingerprint"]  # 4f22c48: the first set of a mapping
    check_same_dataset(Checkpoint(data_fingerprint=recorded), mapping, "old.pt")
    with pytest.raises(ResumeError, match="the dataset changed"):  # 5 is not what 4f22c48 counted for this mapping
        check_same_dataset(Checkpoint(data_fingerprint={**recorded, "val_images": 5}), mapping, "old.pt")
    folder = tmp_path / "c"  # a list under val: 4f22c48 joined it into one set, so it counted every image, as today
    listed = check_data(str(write_yaml(folder, shapes_dir, list(lists(folder, shapes_dir, "val", {"day": slice(0, 3), "night": slice(3, 5)}).values()))))
    assert len(listed["val_sets"]) == 2 and dataset_fingerprint(listed)["val_images"] == 5
    check_same_dataset(Checkpoint(data_fingerprint={**recorded, "val_images": 5}), listed, "old.pt")
    with pytest.raises(ResumeError, match="the dataset changed"):
        check_same_dataset(Checkpoint(data_fingerprint=recorded), listed, "old.pt")


# --- a run of 7f3d9f3, when the LR schedule, results.csv, the checkpoint files, unfreezing and averaging were callbacks ---
RECIPE_FIXTURE = FIXTURE.parent / "7f3d9f3_recipe_last.pt"


def test_a_run_of_7f3d9f3_resumes_with_its_recipe_callbacks_states_in_todays_recipe_parts(tmp_path, shapes_dir, caplog):
    """Its lr_schedule, results_csv and checkpoint callbacks' states (under `callbacks`) become the schedule's, the results'
    and the saver's: results.csv keeps its two rows, epoch 3 has the 4-epoch linear schedule's LR, the declared unfreeze
    stage (epoch 2: all) trains the frozen layers, and averaging runs at the end. No state is warned about as unknown."""
    data = write_data(tmp_path / "data", shapes_dir)  # the same 8 / 4 shapes images it was trained on
    ckpt = torch.load(RECIPE_FIXTURE, weights_only=True)
    assert {"lr_schedule", "results_csv", "checkpoint"} <= set(ckpt["callbacks"]) and "recipe" not in ckpt
    ckpt["train_args"]["data"] = str(data)
    old = tmp_path / "old" / "last.pt"
    old.parent.mkdir()
    torch.save(ckpt, old)
    caplog.set_level("INFO", logger="yolo_cb")
    stages = ckpt["train_args"]["callbacks"]  # a resume takes no callbacks from a file: they are given again
    YOLO(str(old)).train(resume=True, callbacks=stages, project=str(tmp_path / "runs"), name="resumed")
    run = tmp_path / "runs" / "resumed"
    last = load_checkpoint(run / "weights" / "last.pt")
    assert last.epoch == 3 and last.finished is True
    with open(run / "results.csv", newline="") as file:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(file)]
    assert [int(float(r["epoch"])) for r in rows] == [1, 2, 3, 4]
    assert float(rows[0]["train/box_loss"]) == pytest.approx(4.87227)  # the old run's row
    assert float(rows[2]["lr/pg0"]) == pytest.approx(0.002 * ((1 - 2 / 4) * (1 - 0.01) + 0.01), rel=1e-6)  # lr0, lrf 0.01, epoch 2 of 4
    frozen = [k for k in ckpt["model"] if k.startswith(("model.0.", "model.1.")) and k.endswith(".weight")]
    assert frozen and all(not torch.equal(ckpt["model"][k], last.model[k]) for k in frozen)  # unfrozen at epoch 2: trained
    assert "callback 'lr_schedule'" not in caplog.text and "callback 'checkpoint'" not in caplog.text
    assert "callback 'results_csv'" not in caplog.text
    assert any(line.startswith("average_best:") for line in caplog.messages)
    assert len(last.recipe["saver"]["topk"]) == 2 and len(last.recipe["results"]["rows"]) == 4


# --- a run of 7d42114, when stop_close_mosaic=finish was the stop_stage callback and declarations acted at run time -----
STAGE_FIXTURE = FIXTURE.parent / "7d42114_stop_stage_last.pt"


def test_a_run_of_7d42114_resumes_its_shortened_length_and_declared_recipe(tmp_path, shapes_dir, caplog):
    """Early stopping fired after epoch 2 of 6 and stop_close_mosaic=finish moved the end to epoch 4, held as the
    stop_stage callback's state; the resume (inside the stage) loads it into early stopping's state, trains epoch 4 only
    and ends there as early stopping. Its declared patience (1, the setting says 100) and unfreeze stage (epoch 3: all)
    are the recipe's, folded into the settings; no state is warned about as unknown."""
    data = write_data(tmp_path / "data", shapes_dir)  # the same 8 / 4 shapes images it was trained on
    ckpt = torch.load(STAGE_FIXTURE, weights_only=True)
    assert ckpt["callbacks"]["stop_stage"] == {"end": 4} and "early_stop" not in ckpt["recipe"] and ckpt["epoch"] == 2
    ckpt["train_args"]["data"] = str(data)
    old = tmp_path / "old" / "last.pt"
    old.parent.mkdir()
    torch.save(ckpt, old)
    caplog.set_level("INFO", logger="yolo_cb")
    model = YOLO(str(old))
    model.train(resume=True, callbacks=ckpt["train_args"]["callbacks"], project=str(tmp_path / "runs"), name="resumed")
    trainer = model.trainer
    assert trainer._recipe.early_stop.patience == 1 and trainer.args.patience == 1 and trainer.args.epochs == 6
    assert trainer._recipe.unfreeze.stages == {3: "all"}
    assert trainer.epochs == 4 and trainer.stop_cause == StopCause.EARLY_STOPPING
    assert trainer.stop_reason == "early stopping, after the close_mosaic stage (epoch 4)"
    run = tmp_path / "runs" / "resumed"
    last = load_checkpoint(run / "weights" / "last.pt")
    assert last.epoch == 3 and last.finished is True and last.recipe["early_stop"] == {"end": 4}
    with open(run / "results.csv", newline="") as file:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(file)]
    assert [int(float(r["epoch"])) for r in rows] == [1, 2, 3, 4]
    frozen = [k for k in ckpt["model"] if k.startswith(("model.0.", "model.1.")) and k.endswith(".weight")]
    assert frozen and all(not torch.equal(ckpt["model"][k], last.model[k]) for k in frozen)  # unfrozen at epoch 3: trained
    assert "callback 'stop_stage'" not in caplog.text

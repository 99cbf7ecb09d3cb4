"""docs/callbacks.md: every example of "Coming from SuperGradients, Keras, Lightning and Hugging Face" runs (all in one tiny
training), and the table of other frameworks' event names is the one the errors use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from yolo_cb import YOLO
from yolo_cb.callbacks.events import EVENTS, FOREIGN_EVENTS

DOC = Path(__file__).resolve().parents[1] / "docs" / "callbacks.md"


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", section("Coming from SuperGradients, Keras, Lightning and Hugging Face"), re.S)


@pytest.mark.slow
def test_every_coming_from_example_runs(tiny, tmp_path):
    blocks = examples()
    assert len(blocks) >= 8
    model = YOLO("yolox-nano.yaml")
    settings, namespaces, registered = {}, [], []
    for code in blocks:
        before = {id(e) for e in model.callbacks.entries()}
        namespace = {"model": model}
        exec(compile(code, f"{DOC.name} example", "exec"), namespace)  # noqa: S102 - the documented code, as a user runs it
        settings.update(namespace.get("settings", {}))
        namespaces.append(namespace)
        registered += [e for e in model.callbacks.entries() if id(e) not in before]
    run = {**{k: v for k, v in tiny.items() if k != "no_aug_epochs"}, "epochs": 2, **settings}
    model.train(**run)
    functions = {id(e.fn) for e in registered}
    ran = [e for e in model.trainer.callbacks.entries() if id(e.fn) in functions]  # the trainer's copies of the entries
    assert len(ran) == len(registered) and all(e.calls > 0 and not e.errors for e in ran), [(e.name, e.calls, e.errors) for e in ran]
    weights = tmp_path / "runs" / "exp" / "weights"
    assert (weights / "initial.pt").is_file() and (weights / "epoch2.pt").is_file() and len(list(weights.glob("best_epoch*.pt"))) == 2
    history = next(ns["history"] for ns in namespaces if "history" in ns)
    assert [h["epoch"] for h in history] == [0, 1]
    grad_norms = next(ns["grad_norms"] for ns in namespaces if "grad_norms" in ns)
    assert grad_norms and all(g > 0 for g in grad_norms)
    counter = next(e.owner for e in registered if type(e.owner).__name__ == "ValBatchCounter")
    assert set(counter.per_epoch) == {0, 1}  # validator.epoch during training (the final validation of best.pt counts as the last epoch)


def test_event_name_table_matches_the_hints():
    events = section("Events")
    table = events[events.index("| their name |"):].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3:
            theirs, ours = [n.strip() for n in cells[0].split("/")], [re.match(r"\w+", n.strip()).group(0) for n in cells[2].split("/")]
            for i, group in enumerate(theirs):
                for name in group.split(","):
                    rows[name.strip()] = ours[min(i, len(ours) - 1)]
    documented = {k: v for k, v in rows.items() if k in FOREIGN_EVENTS or k not in EVENTS}
    assert documented == {k: v for k, (v, _) in FOREIGN_EVENTS.items()}


def section_examples(title: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section(title), re.S)


def test_order_examples_place_the_callbacks_as_documented():
    import torch

    from yolo_cb.assembly.assemble import build_trainer_callbacks
    from yolo_cb.settings.config import get_config

    model = YOLO("yolox-nano.yaml")
    (code,) = section_examples("Order")
    exec(compile(code, f"{DOC.name} Order example", "exec"), {"model": model, "torch": torch})  # noqa: S102 - the documented code
    cb = build_trainer_callbacks(get_config({"tensorboard": False, "onnx_check": False}), model.callbacks)
    assert [e.name for e in cb.entries("on_before_optimizer_step")] == ["clip", "grad_log"]
    epoch_end = [e.name for e in cb.entries("on_fit_epoch_end")]
    assert epoch_end.index("notify") > epoch_end.index("mlflow")
    yaml_block = re.search(r"```yaml\n(.*?)```", section("Order"), re.S).group(1)
    assert "on_fit_epoch_end: {call: mypkg.cbs:notify, name: notify, after: mlflow}" in yaml_block


def test_strict_mode_example_registers_what_it_says():
    model = YOLO("yolox-nano.yaml")
    (code,) = section_examples("Strict mode")
    exec(compile(code, f"{DOC.name} Strict example", "exec"), {"model": model})  # noqa: S102 - the documented code
    assert [e.name for e in model.callbacks.entries("on_params_update")] == ["never_fires"]


def test_the_controls_section_is_the_one_list_of_controls():
    """docs/callbacks.md's "Controls" table is yolo_cb/settings/controls.py CONTROLS, row for row."""
    from yolo_cb.settings.controls import CONTROLS, controls_table

    controls = section("Controls")
    table = controls[controls.index("| control |"):].split("\n\n")[0] + "\n"
    assert table == controls_table() and len(table.splitlines()) == len(CONTROLS) + 2

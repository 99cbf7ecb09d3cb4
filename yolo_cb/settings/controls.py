"""The controls: the one list of how a callback steers a run (the settings are fixed once a run is planned).

Every place that names the controls is made from or checked against CONTROLS: the read-only names' error
(training/run_state.py CONTROLS_HINT), the settings' error (config.py), the Trainer's docstring, docs/callbacks.md's
"Controls" table (tests/test_callbacks_doc.py) and tests/test_trainer_contract.py.
"""

from __future__ import annotations

from typing import NamedTuple


class Control(NamedTuple):
    """One way a callback steers the run: how it is called (`usage`), its trainer name, what it does."""

    name: str
    usage: str
    does: str


CONTROLS = (
    Control('stop', '`trainer.stop = True`',
            'end the run at the next batch or epoch boundary (see Stopping)'),
    Control('request_stop', '`trainer.request_stop(cause, reason)`',
            'the same, with a cause (StopCause) and a reason; the first cause given is kept'),
    Control('stop_reason', '`trainer.stop_reason = ...`',
            'why the run stops (with `trainer.stop = True`)'),
    Control('withdraw_stop', '`trainer.withdraw_stop(cause)`',
            "withdraw a pending stop of that cause (a signal's or the time limit's stands); True if one was withdrawn"),
    Control('end_after', '`trainer.end_after(epochs)`',
            'shorten the run: it ends after `epochs` epochs (from those completed up to the planned ones); the LR schedule keeps the planned curve'),
    Control('validate_each_epoch', '`trainer.validate_each_epoch()`',
            'validate after every epoch from now on, whatever `val_period` says'),
    Control('validate_every_epoch', '`trainer.validate_every_epoch = True`',
            'the same, as a flag'),
    Control('patience', '`trainer.patience = n`',
            'epochs without improvement before early stopping ends the run (0: never)'),
    Control('restore_best', '`trainer.restore_best = False`',
            "after early stopping, end on the last epoch's weights instead of best.pt's (the `restore_best` setting's value until set)"),
    Control('set_lr', '`trainer.set_lr(lr, group=None)`, or `group["lr"] = ...` on `trainer.optimizer.param_groups`',
            'the LR from now on (one group, or every group); the schedule continues from it (`lr_scheduler=`, "Training control" below)'),
    Control('loss', '`trainer.loss = ...` in `on_train_batch_loss_end`',
            'the loss that is backpropagated for this batch'),
)
CONTROL_NAMES = tuple(c.name for c in CONTROLS)
CONTROLS_HINT = f"callbacks steer the run through the controls: {', '.join('trainer.' + n for n in CONTROL_NAMES)} (docs/callbacks.md, \"Controls\")"


def controls_table() -> str:
    """docs/callbacks.md's "Controls" table (tests/test_callbacks_doc.py compares the doc with it)."""
    return "| control | what it does |\n|---|---|\n" + "".join(f"| {c.usage} | {c.does} |\n" for c in CONTROLS)


def controls_doc(indent: str = "    ") -> str:
    """The controls as a docstring part (the Trainer's): one line each, from CONTROLS."""
    return f"{indent}Controls:\n" + "".join(f"{indent}- {c.name}: {c.does.replace('`', '')}\n" for c in CONTROLS)

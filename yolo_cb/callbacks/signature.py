"""Checks made when a callback is registered, so that a mistake fails at registration instead of mid-training.

- `check_signature`: yolo-cb calls every callback with one argument (the trainer, validator, predictor or exporter that
  fires the event). A function that cannot take exactly that — Lightning's `(trainer, pl_module)`, Hugging Face's
  `(args, state, control)` — is refused with one line naming the form to write.
- `run_on_register`: an object's `on_register(self, callbacks)` method (wall_e's hook) is called once, with the
  Callbacks it was added to, right after its methods are registered.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from yolo_cb.callbacks.events import EXPORTER_EVENTS, PREDICTOR_EVENTS, VALIDATOR_EVENTS

# the method an object registered with add_callbacks may define to hear that it was registered (not an event)
REGISTER_HOOK = "on_register"
# parameter names that tell another framework's callback form -> what to write here
FOREIGN_FORMS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"pl_module"}), "Lightning's (trainer, pl_module): here trainer.model is the module"),
    (frozenset({"state", "control"}), "Hugging Face's (args, state, control): here trainer.args, trainer.epoch, trainer.stop = True"),
    (frozenset({"logs"}), "Keras' (epoch/batch, logs): here trainer.epoch, trainer.metrics"),
    (frozenset({"context"}), "SuperGradients' (context): here the trainer holds what the context did"),
)


def fired_with(event: str) -> str:
    """The object an event's callbacks receive."""
    for events, owner in ((VALIDATOR_EVENTS, "validator"), (PREDICTOR_EVENTS, "predictor"), (EXPORTER_EVENTS, "exporter")):
        if event in events:
            return owner
    return "trainer"


def check_signature(event: str, fn: Callable, name: str) -> None:
    """TypeError (one line) when `fn` cannot be called with the single object `event` fires with."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or extension callable without an inspectable signature: not checked
        return
    try:
        signature.bind(None)
    except TypeError:
        owner = fired_with(event)
        params = [p for p in signature.parameters if p != "self"]
        form = next((text for names, text in FOREIGN_FORMS if names & set(params)), "")
        raise TypeError(f"callback '{name}' for '{event}' takes ({', '.join(params)}), but yolo-cb calls it with one argument, the "
                        f"{owner}: write def {getattr(fn, '__name__', event)}({'self, ' if inspect.ismethod(fn) else ''}{owner})"
                        + (f" (that is {form})" if form else "")) from None


def run_on_register(obj: Any, callbacks: Any) -> None:
    """Call `obj.on_register(callbacks)` (or `obj.on_register()`) once, when it defines one."""
    hook = getattr(obj, REGISTER_HOOK, None)
    if not callable(hook):
        return
    try:
        inspect.signature(hook).bind(callbacks)
    except TypeError:
        hook()
        return
    except ValueError:
        pass
    hook(callbacks)

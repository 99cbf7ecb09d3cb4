"""CallbackError: what a failing callback raises, naming the callback and the event; also an instance of the callback's
own exception type, so that `except ValueError:` around model.train() catches a callback's ValueError."""

from __future__ import annotations


class CallbackError(RuntimeError):
    """A callback raised; the message names the callback and the event, the cause is chained. The error raised is also an
    instance of the callback's own exception type (`except ValueError:` catches a callback's ValueError; `except
    CallbackError:` catches every callback's failure): `CallbackError.of(...)` makes it, `.error` is the original."""

    def __init__(self, callback_name: str, event: str, error: BaseException, where: str = ""):
        self.callback_name, self.event, self.error, self.where = callback_name, event, error, where
        place = f" ({where})" if where and where != callback_name else ""
        super().__init__(f"callback '{callback_name}'{place} failed in event '{event}': {type(error).__name__}: {error}")

    def __str__(self) -> str:  # the message above, never the original type's own __str__ (which may read its attributes)
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # the per-type classes are made at run time: pickled as the call that makes them again
        return CallbackError.of, (self.callback_name, self.event, self.error, self.where)

    @classmethod
    def of(cls, callback_name: str, event: str, error: BaseException, where: str = "") -> CallbackError:
        """A CallbackError that is also an instance of type(error)."""
        return _error_class(type(error))(callback_name, event, error, where)


_ERROR_CLASSES: dict[type, type] = {}  # the original exception type -> CallbackError subclass that also derives from it


def _error_class(original: type) -> type:
    if issubclass(original, CallbackError) or original in (Exception, RuntimeError):
        return original if issubclass(original, CallbackError) else CallbackError
    if original not in _ERROR_CLASSES:
        try:
            _ERROR_CLASSES[original] = type("CallbackError", (CallbackError, original), {"__module__": __name__, "__qualname__": "CallbackError"})
        except TypeError:  # a type that cannot be a base (its C layout conflicts): a plain CallbackError, the original as .error
            _ERROR_CLASSES[original] = CallbackError
    return _ERROR_CLASSES[original]

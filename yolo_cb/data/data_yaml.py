"""The data YAML, typed: every key it may hold, with its type and its rule, read once where the file is read.

:func:`read_data_yaml` reads the file (a regular file of at most 1 MiB: read_bounded in yolo_cb/utils/files.py), parses
it with the bounded YAML loader (yolo_cb/utils/yaml_safe.py) and returns a :class:`DataYaml`. Each of its fields is typed by
the reader its annotation names, and a field without one fails at import, so a key added here cannot skip the check.
A value out of its rule is one line naming the file, the key, the value (cut to about 80 characters, control
characters escaped) and what would be right::

    yolo-cb: error: /data/my.yaml: 'nc' is 'abc'; it must be the number of classes, a whole number >= 1

Keys yolo-cb does not read (a Roboflow export's ``roboflow:``, a pose set's ``kpt_shape:``) are named in one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

from yolo_cb.data import synthetic
from yolo_cb.errors import DataError, short_repr
from yolo_cb.utils.log import printable
from yolo_cb.utils.suggest import did_you_mean
from yolo_cb.utils.yaml_safe import load_yaml

LOGGER = logging.getLogger("yolo_cb")

MAX_GENERATED = 100_000  # images per split `generate:` may ask for: about an hour and 5 GB at the default sizes
MAX_SIDE = 4096  # pixels: the largest min_size / max_size of a generated image
MAX_PATH = 4096  # characters in a path (Linux's PATH_MAX): a longer value names no file
EXAMPLES = {"train": "images/train", "val": "images/val"}  # for the line of a missing required key

Split = str | list[str] | None  # one path, or several (joined for train; several sets for val)
ValSets = str | list[str] | dict[str, str | list[str]] | None  # val may also name its sets {name: path}

READ_ELSEWHERE = ("file", "written", "raw")  # DataYaml fields that are not YAML keys

_warned: set[str] = set()  # the YAMLs whose unread keys were named (once per file and process)


class DatasetConfigError(DataError):
    """A dataset YAML that is missing a key or has a value of the wrong kind."""


class Wrong(Exception):
    """A value out of its rule: the text says what would be right; `key` / `value` name a part of it (generate's keys)."""

    def __init__(self, text: str, key: str | None = None, value: Any = None):
        super().__init__(text)
        self.key, self.value = key, value


@dataclass(frozen=True)
class Rule:
    """How one key is read: `read` types a value from the YAML (None when the key is absent), or raises Wrong."""

    read: Callable[[Any], Any]


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict)) and not value)


def _whole(low: int, high: int | None, meaning: str) -> Rule:
    """A whole number in [low, high] (an integral float counts; a bool or text does not)."""

    def read(value: Any) -> int | None:
        if value is None:
            return None
        whole = value if isinstance(value, int) else int(value) if isinstance(value, float) and value.is_integer() else None
        if isinstance(value, bool) or whole is None or whole < low or (high is not None and whole > high):
            span = f"from {low:,} to {high:,}" if high is not None else f">= {low}"
            raise Wrong(f"it must be {meaning}, a whole number {span}")
        return whole
    return Rule(read)


def one_path(value: Any) -> str:
    """A path as the YAML gives it: text, no NUL, at most MAX_PATH characters, its ~user known."""
    if not isinstance(value, str):
        raise Wrong("it must be a path (text)")
    text = value
    if "\0" in text or len(text) > MAX_PATH:
        raise Wrong(f"no path {'holds a NUL character' if chr(0) in text else f'is longer than {MAX_PATH} characters'}; write the path")
    try:
        Path(text).expanduser()
    except RuntimeError:
        raise Wrong(f"{text.split('/')[0]!r} is the home folder of no user on this machine; write the path out") from None
    return text


def _root(value: Any) -> str | None:
    """`path:`: a folder path (a whole number is a folder's name: 'path: 2017')."""
    return None if _empty(value) else one_path(str(value) if isinstance(value, int) and not isinstance(value, bool) else value)


def _split(value: Any) -> Split:
    if _empty(value):
        return None
    try:
        return [one_path(v) for v in value] if isinstance(value, list) else one_path(value)
    except Wrong:
        raise Wrong("it must be an images folder, a .txt list, a COCO JSON or a VOC folder (a path), or a list of those") from None


def _val_sets(value: Any) -> ValSets:
    if _empty(value) or not isinstance(value, dict):
        return _split(value)
    bad = next((k for k in value if not isinstance(k, str) or not k or "/" in k), None)
    if bad is not None:
        raise Wrong(f"as a mapping it names validation sets {{name: path}}, and {short_repr(bad)} is not a name (text without /)")
    sets = {name: _split(path) for name, path in value.items()}
    if any(path is None for path in sets.values()):
        raise Wrong("as a mapping it names validation sets {name: path}, each with its path")
    return sets


def _class_id(key: Any) -> int | None:
    """A names key as a class id: an int, or text or a float that is exactly an integer (never 1.5 -> 1, never a bool)."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    if isinstance(key, float):
        return int(key) if key.is_integer() else None
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return None


def _names(value: Any) -> dict[int, str] | None:
    """`names` as a list or a {id: name} mapping -> {0: name, 1: name, ...}; None when absent (a COCO JSON or a VOC split
    gives them once the root is known)."""
    if _empty(value):
        return None
    if isinstance(value, list):
        return {i: str(n) for i, n in enumerate(value)}
    if not isinstance(value, dict):
        raise Wrong("it must be a list of class names or an {id: name} mapping, e.g. 'names: [cat, dog]'")
    bad = [k for k in value if _class_id(k) is None]
    if bad:
        raise Wrong(f"its keys must be integer class ids (0, 1, ...), not {short_repr(bad[0])}; number the classes 0..{len(value) - 1}")
    names = {_class_id(k): str(v) for k, v in value.items()}
    if sorted(names) != list(range(len(names))):
        raise Wrong(f"its ids must be 0..{len(names) - 1} without gaps; number the classes 0..{len(names) - 1} (and the class "
                    f"ids in the label files with them)")
    return dict(sorted(names.items()))


def _texts(meaning: str) -> Rule:
    def read(value: Any) -> tuple[str, ...]:
        items = [] if _empty(value) else value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) and v for v in items):
            raise Wrong(f"it must be {meaning}, or a list of them")
        return tuple(items)
    return Rule(read)


def _ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise Wrong("it must be a list of whole numbers, the COCO category id of each class in names' order")
    return tuple(value)


def _choice(*choices: str) -> Rule:
    def read(value: Any) -> str | None:
        if value is not None and value not in choices:
            raise Wrong(f"it must be one of: {', '.join(choices)}")
        return value
    return Rule(read)


def rules_of(cls: type) -> dict[str, Rule]:
    """{field: its Rule} of a typed reader class; TypeError for a field without one (so none can skip the check)."""
    hints = get_type_hints(cls, include_extras=True)
    out = {}
    for f in fields(cls):
        rule = next((m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Rule)), None)
        if rule is None and f.name not in READ_ELSEWHERE:
            raise TypeError(f"{cls.__name__}.{f.name} has no Rule: annotate it as Annotated[type, Rule(...)]")
        if rule is not None:
            out[f.name] = rule
    return out


@dataclass(frozen=True)
class GenerateSpec:
    """`generate:`: the synthetic set made when the images are missing (yolo_cb.data.synthetic.generate_shapes)."""

    kind: Annotated[str, _choice("shapes")] = "shapes"
    seed: Annotated[int, _whole(0, 2**32 - 1, "the random seed")] = 0
    train: Annotated[int, _whole(0, MAX_GENERATED, "the number of train images")] = 320
    val: Annotated[int, _whole(0, MAX_GENERATED, "the number of val images")] = 100
    min_size: Annotated[int, _whole(32, MAX_SIDE, "the smallest image side in pixels")] = synthetic.MIN_SIZE
    max_size: Annotated[int, _whole(32, MAX_SIDE, "the largest image side in pixels")] = synthetic.MAX_SIZE
    max_objects: Annotated[int, _whole(1, 100, "the most shapes per image")] = synthetic.MAX_OBJECTS
    jpeg_quality: Annotated[int, _whole(1, 100, "the JPEG quality")] = synthetic.JPEG_QUALITY

    def images(self) -> int:
        return self.train + self.val


GENERATE_RULES = rules_of(GenerateSpec)  # the keys `generate:` may hold, each with its rule


def _generate(value: Any) -> GenerateSpec | None:
    if _empty(value):
        return None
    spec = {"kind": value} if isinstance(value, str) else value
    if not isinstance(spec, dict):
        raise Wrong("it must be a mapping such as {kind: shapes, train: 320, val: 100}, or the kind ('shapes')")
    rules = GENERATE_RULES
    unknown = next((k for k in spec if k not in rules), None)
    if unknown is not None:
        raise Wrong(f"generate reads only {', '.join(rules)}.{did_you_mean(str(unknown), rules)}", key=str(unknown),
                    value=spec[unknown])
    typed = {}
    for key, rule in rules.items():
        try:
            typed[key] = rule.read(spec.get(key))
        except Wrong as wrong:
            raise Wrong(str(wrong), key=key, value=spec.get(key)) from None
    made = GenerateSpec(**{k: v for k, v in typed.items() if v is not None})
    if made.min_size > made.max_size:
        raise Wrong(f"it must be at most max_size ({made.max_size})", key="min_size", value=made.min_size)
    return made


@dataclass(frozen=True)
class DataYaml:
    """A data YAML, each key typed and checked by its Rule (the module docstring)."""

    path: Annotated[str | None, Rule(_root)]  # the dataset root
    train: Annotated[Split, Rule(_split)]
    val: Annotated[ValSets, Rule(_val_sets)]
    test: Annotated[Split, Rule(_split)]
    names: Annotated[dict[int, str] | None, Rule(_names)]  # None: the train COCO JSON's or VOC split's classes
    nc: Annotated[int | None, _whole(1, None, "the number of classes")]
    download: Annotated[tuple[str, ...], _texts("the http(s) URL of a zip or tar archive")]
    generate: Annotated[GenerateSpec | None, Rule(_generate)]
    category_ids: Annotated[tuple[int, ...] | None, Rule(_ids)]
    file: Path = Path()  # the YAML, resolved
    written: tuple[str, ...] = ()  # every key the file holds, in its order (error lines list them)
    raw: dict = field(default_factory=dict)  # the mapping as parsed (what resolve.py reads the root and splits from)


KEY_RULES = rules_of(DataYaml)  # the keys a data YAML may hold, each with its rule


def wrong_value(file: Path, key: str, value: Any, text: str) -> DatasetConfigError:
    """The one line for a value out of its rule: the file, the key, the value cut short, what would be right."""
    return DatasetConfigError(f"{printable(file)}: '{key}' is {short_repr(value)}; {text}")


def read_data_yaml(file: Path) -> DataYaml:
    """The data YAML `file` read, typed and checked (DatasetConfigError, one line, for the first value out of its rule)."""
    raw = load_yaml(file, DatasetConfigError, "dataset YAML")
    if not isinstance(raw, dict):
        raise DatasetConfigError(f"{printable(file)}: expected a mapping with train/val/names keys, got {type(raw).__name__}")
    typed = {}
    for key, rule in KEY_RULES.items():
        try:
            typed[key] = rule.read(raw.get(key))
        except Wrong as wrong:
            shown = f"{key}: {printable(wrong.key)[:60]}" if wrong.key else key
            raise wrong_value(file, shown, wrong.value if wrong.key else raw.get(key), str(wrong)) from None
    data = DataYaml(**typed, file=file, written=tuple(str(k) for k in raw), raw=raw)
    _check_together(data)
    _name_unread(data)
    return data


def _check_together(data: DataYaml) -> None:
    """The rules across keys: train and val given; nc and category_ids as many as the names."""
    for key in ("train", "val"):
        if getattr(data, key) is None:
            raise DatasetConfigError(f"{printable(data.file)}: required key '{key}' is missing or empty; add it, e.g. "
                                     f"'{key}: {EXAMPLES[key]}'")
    if data.names is not None and data.nc is not None and data.nc != len(data.names):
        raise DatasetConfigError(f"{printable(data.file)}: 'nc' is {data.nc} but 'names' has {len(data.names)} entries; make "
                                 f"them agree, or leave nc out")
    if data.names is not None:
        check_category_ids(data, len(data.names))


def check_category_ids(data: DataYaml, classes: int) -> None:
    if data.category_ids is not None and len(data.category_ids) != classes:
        raise wrong_value(data.file, "category_ids", list(data.category_ids),
                          f"it must list {classes} ids, one per class name ({len(data.category_ids)} given)")


def _name_unread(data: DataYaml) -> None:
    unread = [k for k in data.written if k not in KEY_RULES]
    if unread and str(data.file) not in _warned:
        _warned.add(str(data.file))
        hints = "".join(did_you_mean(k, KEY_RULES) for k in unread)
        LOGGER.warning(printable(f"{data.file}: yolo-cb does not read {', '.join(short_repr(k, 40) for k in unread[:10])}"
                                 f"{' ...' if len(unread) > 10 else ''} (it reads {', '.join(KEY_RULES)}).{hints}"))

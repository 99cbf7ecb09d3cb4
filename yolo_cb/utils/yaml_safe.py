"""The one YAML loader for files and values yolo-cb did not write: safe tags only, and aliases bounded.

PyYAML's safe loader already refuses tags that build objects, but an alias (``*name``) repeats a whole subtree
without copying it: nine levels of nine aliases fit in 500 bytes and stand for 9**9 values, which any code that
walks, prints or copies them (``str()``, a deep copy, a repr in an error message) expands until memory runs out.
Here the composed document is measured before anything is built from it: aliases may add at most
``ALIAS_BUDGET`` values to what the file spells out, and an alias that contains itself is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from yolo_cb.errors import ConfigError, UserError, os_reason

ALIAS_BUDGET = 100_000  # values that aliases may add to a document beyond those written out in it


class YAMLLimitError(yaml.MarkedYAMLError):
    """A YAML document refused before it is built: aliases past ALIAS_BUDGET, an alias inside itself, too deep a nesting."""


class BoundedSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that measures each composed document before constructing it (see the module docstring)."""

    def compose_document(self):
        node = super().compose_document()
        check_expansion(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_expansion(root: yaml.Node) -> None:
    """Raise YAMLLimitError when ``root`` expands to more than ALIAS_BUDGET values beyond its distinct nodes, or has a cycle.

    One pass over the distinct nodes (an iterative depth-first walk, sizes memoised): the expansion itself never happens."""
    sizes: dict[int, int] = {}
    started: set[int] = set()  # nodes on the current path (started, not finished): reaching one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            started.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            continue
        if key in sizes:
            continue
        if key in started:
            raise YAMLLimitError(problem="an alias refers to a collection that contains it (a recursive structure)",
                                 problem_mark=node.start_mark)
        started.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))
    if sizes[id(root)] - len(sizes) > ALIAS_BUDGET:
        raise YAMLLimitError(problem=f"its aliases (*name) expand it to {sizes[id(root)]:,} values, {len(sizes):,} written out "
                                     f"and more than the {ALIAS_BUDGET:,} repeats allowed (an 'alias bomb')",
                             problem_mark=root.start_mark)


def yaml_loads(text: str) -> Any:
    """Parse one YAML document with BoundedSafeLoader; any failure raises a yaml.YAMLError (YAMLLimitError for the limits)."""
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise YAMLLimitError(problem="nested too deeply to parse") from None


def yaml_error_message(path, error: Exception, what: str = "YAML file") -> str:
    """One line for a YAML that cannot be loaded safely: the file, the line and column, and what to change."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = " ".join(str(getattr(error, "problem", None) or error).split())
    if type(error).__name__ == "YAMLLimitError":
        return f"{path}: {where}refused: {problem}; yolo-cb does not expand such a {what}: write the values out"
    if "could not determine a constructor for the tag" in problem:
        tag = problem.split("tag", 1)[1].strip(" '\"").replace("tag:yaml.org,2002:", "!!")
        return (f"{path}: {where}the tag '{tag}' is not allowed in a {what}; yolo-cb loads YAML safely (mappings, lists, "
                f"strings, numbers, booleans only): replace the tagged value with a plain one")
    return f"{path}: {where}not valid YAML ({problem}); fix the {what} so that it parses"


def load_yaml(path, error_type: type[UserError] = ConfigError, what: str = "YAML file"):
    """A text file parsed by yolo_cb.utils.yaml_safe (safe tags, bounded aliases); any failure (I/O, not text, not YAML,
    an unsafe tag, an alias bomb) raises ``error_type`` with one line naming the file and the place."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise error_type(f"{path}: not a text file, so not a {what}") from None
    except OSError as e:
        raise error_type(f"{path}: cannot read the {what} ({os_reason(e)})") from None
    try:
        return yaml_loads(text)
    except yaml.YAMLError as e:
        raise error_type(yaml_error_message(path, e, what)) from None

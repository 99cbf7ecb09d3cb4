"""The one YAML loader for files and values yolo-cb did not write: safe tags only, and aliases bounded.

PyYAML's safe loader already refuses tags that build objects, but an alias (``*name``) repeats a whole subtree
without copying it: nine levels of nine aliases fit in 500 bytes and stand for 9**9 values, which any code that
walks, prints or copies them (``str()``, a deep copy, a repr in an error message) expands until memory runs out.
Here the composed document is measured before anything is built from it: aliases may add at most
``ALIAS_BUDGET`` values to what the file spells out, and an alias that contains itself is refused. A file is read
by yolo_cb.utils.files.read_bounded first: a regular file of at most 1 MiB (YAML_FILE), so the parse itself is bounded too.
"""

from __future__ import annotations

from typing import Any

import yaml

from yolo_cb.errors import ConfigError, UserError, os_reason
from yolo_cb.utils.files import YAML_FILE, FileRefused, read_bounded_text

ALIAS_BUDGET = 100_000  # values that aliases may add to a document beyond those written out in it
# libyaml's parser where PyYAML has it (it nests at most 1000 levels): 1 MiB of small values loaded in 4-5 s on a busy
# 2-core machine, ~30 s with the pure-Python parser; the constructor (which tags are allowed) is PyYAML's safe one either way
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YAMLLimitError(yaml.MarkedYAMLError):
    """A YAML document refused before it is built: aliases past ALIAS_BUDGET, an alias inside itself, too deep a nesting."""


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
    """Parse one YAML document safely, its expansion measured (check_expansion) before any value is built from it; any
    failure raises a yaml.YAMLError (YAMLLimitError for the limits)."""
    loader = SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_expansion(node)
        return loader.construct_document(node)
    except RecursionError:
        raise YAMLLimitError(problem="nested too deeply to parse") from None
    except yaml.MarkedYAMLError as error:  # libyaml's own limit, said as the pure-Python parser's RecursionError is
        if "maximum nesting depth" not in str(error.problem):
            raise
        raise YAMLLimitError(problem="nested too deeply to parse (over 1000 levels)", problem_mark=error.problem_mark) from None
    finally:
        loader.dispose()


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
    """A text file read by read_bounded (yolo_cb/utils/files.py: a regular file of at most 1 MiB) and parsed here (safe tags, bounded
    aliases); any failure (I/O, a FIFO or a folder, too large, not text, not YAML, an unsafe tag, an alias bomb) raises
    ``error_type`` with one line naming the file and the place."""
    try:
        text = read_bounded_text(path, YAML_FILE, what)
    except FileRefused as refused:
        raise error_type(str(refused)) from None
    except UnicodeDecodeError:
        raise error_type(f"{path}: not a text file, so not a {what}") from None
    except OSError as e:
        raise error_type(f"{path}: cannot read the {what} ({os_reason(e)})") from None
    try:
        return yaml_loads(text)
    except yaml.YAMLError as e:
        raise error_type(yaml_error_message(path, e, what)) from None

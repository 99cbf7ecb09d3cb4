"""The one YAML loader for files and values yolo-cb did not write: safe tags only, and aliases bounded.

PyYAML's safe loader already refuses tags that build objects, but an alias (``*name``) repeats a whole subtree
without copying it: nine levels of nine aliases fit in 500 bytes and stand for 9**9 values, which any code that
walks, prints or copies them (``str()``, a deep copy, a repr in an error message) expands until memory runs out.
Here the composed document is measured before anything is built from it: aliases may add at most
``ALIAS_BUDGET`` values to what the file spells out, and an alias that contains itself is refused.
"""

from __future__ import annotations

from typing import Any

import yaml

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

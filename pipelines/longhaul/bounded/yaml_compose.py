"""Bounded YAML (pure): a document composed by a loader that counts nodes and nesting as the parser emits them and
refuses anchors and aliases outright, so an alias bomb or a recursive alias never expands and nothing recurses
past the depth limit."""

from __future__ import annotations

from typing import Any

import yaml

from longhaul.bounded.limits import InputError, Limits, dotted_path
from longhaul.bounded.read import too_large

_ANCHOR_HINT = (
    "write the value out in full: anchors (&name), aliases (*name) and merge keys (<<) are refused "
    "because a few lines of them can expand into gigabytes; Kubernetes manifests never need them"
)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a composer that checks every node before composing it: anchors and aliases
    are refused, nodes are counted, nesting is bounded. The parser is lazy and iterative, so a refusal happens
    as soon as the offending event is read and no node is built past a limit."""

    def __init__(self, text: str, file: str, limits: Limits) -> None:
        super().__init__(text)
        self._file, self._limits = file, limits
        self._nodes = 0
        self._depth = 0  # counted, not taken from the path: nested complex keys (`? ? ? a`) do not extend it
        self._loc: tuple[Any, ...] = ()

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's signature
        # The scanner looks ahead across a whole line of `[[[[…` (each could start a key) and keeps one
        # possible key per flow level: bound the level here, or the look-ahead is quadratic in it.
        if self.flow_level >= self._limits.max_depth:
            raise InputError(
                self._file,
                self.line + 1,
                "",
                f"flow collections ([ or {{) nested deeper than the "
                f"{self._limits.max_depth} levels allowed in {self._limits.kind}",
                hint="flatten the document; a spec is about 6 levels deep",
            )
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(index, yaml.ScalarNode):
            loc = (*self._loc, index.value)
        elif isinstance(index, int) and not isinstance(index, bool):
            loc = (*self._loc, index)
        else:  # the document root, or a mapping key
            loc = self._loc
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise InputError(
                self._file, line, dotted_path(loc), "YAML aliases are not allowed", f"*{event.anchor}", _ANCHOR_HINT
            )
        if event.anchor is not None:
            raise InputError(
                self._file, line, dotted_path(loc), "YAML anchors are not allowed", f"&{event.anchor}", _ANCHOR_HINT
            )
        self._nodes += 1
        if self._limits.max_nodes is not None and self._nodes > self._limits.max_nodes:
            raise InputError(
                self._file,
                line,
                dotted_path(loc),
                f"more than {self._limits.max_nodes:,} YAML nodes (keys, values, list items) in {self._limits.kind}",
                hint=self._limits.hint,
            )
        if self._depth >= self._limits.max_depth:
            raise InputError(
                self._file,
                line,
                dotted_path(loc),
                f"nested deeper than the {self._limits.max_depth} levels allowed in {self._limits.kind}",
                hint="flatten the document; a spec is about 6 levels deep",
            )
        saved, self._loc = self._loc, loc
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._loc = saved
            self._depth -= 1


def compose_yaml(text: str, file: str, limits: Limits) -> yaml.Node | None:
    """The node tree of a one-document YAML text (None when empty), composed with every bound of `limits`.

    Raises `InputError` for a limit or a second document, `yaml.YAMLError` for invalid YAML.
    """
    if len(text) > limits.max_bytes or len(text.encode("utf-8")) > limits.max_bytes:
        line = text.encode("utf-8")[: limits.max_bytes].count(b"\n") + 1
        raise too_large(file, line, limits)
    loader = _BoundedLoader(text, file, limits)
    try:
        node = loader.get_node() if loader.check_node() else None
        if node is not None and loader.check_node():
            mark = loader.peek_event().start_mark
            raise InputError(
                file,
                mark.line + 1,
                "",
                "expected one YAML document, found a second one",
                hint="put each Experiment in its own file",
            )
        return node
    finally:
        loader.dispose()

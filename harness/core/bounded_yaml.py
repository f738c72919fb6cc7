"""The one YAML loader for files a user (or a pull request) hands the harness: matrix and
deployment files. It bounds what a file can cost before any value is built, so a malformed
file is one line (BoundedYAMLError), never a traceback, a hang or gigabytes:

* size (`MAX_BYTES`), UTF-8 text without NUL;
* nesting depth (`MAX_DEPTH`) and number of events, counted on PyYAML's event stream (which is
  iterative: 3000-deep nesting would overflow the recursive composer);
* aliases (`MAX_ALIASES`) and the size of the value once aliases are expanded
  (`MAX_EXPANDED_NODES`): an 8-line alias bomb is refused instead of being built and printed;
* duplicate keys in a mapping are refused (PyYAML lets the last one win silently);
* ``.inf`` and ``.nan`` are refused (no setting of the harness is infinite).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_EVENTS = 200_000
MAX_ALIASES = 200
MAX_EXPANDED_NODES = 200_000


class BoundedYAMLError(ValueError):
    """The file cannot be read, is not YAML, or exceeds a bound. str() is one line."""


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line: the problem and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())[:300]


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and non-finite floats."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:   # an unhashable key: the base class says so
                break
            if duplicate:
                raise BoundedYAMLError(f"duplicate key {str(key)[:60]!r} at line "
                                       f"{key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise BoundedYAMLError(f"{node.value!r} at line {node.start_mark.line + 1}: "
                                   f"infinite or NaN numbers are not allowed")
        return value


_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)


def _check_events(text: str) -> None:
    depth = aliases = 0
    for count, event in enumerate(yaml.parse(text, Loader=yaml.SafeLoader), 1):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise BoundedYAMLError(f"nested deeper than {MAX_DEPTH} levels at line "
                                       f"{event.start_mark.line + 1}")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise BoundedYAMLError(f"more than {MAX_ALIASES} aliases (*name)")
        if count > MAX_EVENTS:
            raise BoundedYAMLError(f"more than {MAX_EVENTS} YAML events")


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes in `node` once every alias is expanded (a shared node counted at each use)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(v, memo) for v in node.value)
    else:
        size = 1
    memo[id(node)] = size
    if size > MAX_EXPANDED_NODES:
        raise BoundedYAMLError(f"expands to more than {MAX_EXPANDED_NODES} values (aliases "
                               f"referring to aliases)")
    return size


def loads_bounded(text: str) -> Any:
    """The value of YAML `text`, within the bounds; BoundedYAMLError otherwise."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise BoundedYAMLError(f"larger than {MAX_BYTES // 1024} KiB")
    if "\x00" in text:
        raise BoundedYAMLError("not a text file (it holds NUL bytes)")
    try:
        _check_events(text)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _expanded_size(node, {})
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise BoundedYAMLError(f"not valid YAML: {yaml_problem(exc)}") from None
    except RecursionError:
        raise BoundedYAMLError(f"nested deeper than {MAX_DEPTH} levels") from None


def load_bounded(path: str | os.PathLike[str]) -> Any:
    """`loads_bounded` of the file at `path` (read at most MAX_BYTES + 1 bytes)."""
    try:
        with open(Path(path), "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise BoundedYAMLError(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise BoundedYAMLError(f"larger than {MAX_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BoundedYAMLError("not UTF-8 text (a binary file?)") from None
    return loads_bounded(text)


__all__ = ["BoundedYAMLError", "MAX_ALIASES", "MAX_BYTES", "MAX_DEPTH", "MAX_EXPANDED_NODES",
           "load_bounded", "loads_bounded", "yaml_problem"]

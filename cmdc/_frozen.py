"""Deep-freezing of JSON-like values, so data held by frozen classes stays read-only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def freeze(value: Any, where: str) -> Any:
    """Return a read-only copy of a JSON-like value: dicts become read-only mappings and lists
    become tuples. Raise `TypeError` naming `where` for anything JSON cannot hold losslessly."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is dict or kind is MappingProxyType:
        if not value:
            return _EMPTY
        return MappingProxyType({_key(k, where): freeze(v, f"{where}.{k}") for k, v in value.items()})
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise TypeError(f"{where}: integer {value} is out of the 64-bit range JSON keeps")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where}: {value!r} is not a finite number")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not a string")
            out[k] = freeze(v, f"{where}.{k}")
        return MappingProxyType(out)
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(f"{where}: {type(value).__name__} value {value!r} cannot be stored as JSON")


def _key(k: object, where: str) -> str:
    if type(k) is not str:
        raise TypeError(f"{where}: key {k!r} is not a string")
    return k


def freeze_mapping(value: Mapping[str, Any] | None, where: str) -> Mapping[str, Any]:
    if value is None or (type(value) is dict and not value):
        return _EMPTY
    if not isinstance(value, Mapping):
        raise TypeError(f"{where}: expected a mapping, got {type(value).__name__}")
    frozen: Mapping[str, Any] = freeze(value, where)
    return frozen


def thaw(value: Any) -> Any:
    """The plain (dict / list) form of a frozen value, for JSON encoding."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [thaw(v) for v in value]
    return value


def past_bounds(value: Any, max_values: int, max_depth: int) -> str | None:
    """Why a JSON-like value is too large to take, or None: more than `max_values` values in
    all (object members and array items, counted through every level), or containers nested
    deeper than `max_depth`. Looks at no more than `max_values` values: the cost is bounded
    however large the value is."""
    count = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if not children:
            continue
        if depth >= max_depth:
            return f"nested deeper than {max_depth} levels"
        count += len(children)
        if count > max_values:
            return f"more than {max_values:,} values in all"
        todo.extend((child, depth + 1) for child in children)
    return None

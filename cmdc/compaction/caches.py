"""The compaction's process-wide cache of parsed configs (stores are not cached: each belongs to
the runtime or the compactor that opened it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import CompactConfig

_PARSED: dict[int, tuple[Mapping[str, Any], CompactConfig]] = {}
_PARSED_MAX = 256


def parse_config(config: Mapping[str, Any]) -> CompactConfig:
    """`CompactConfig.from_mapping`, shared by every compactor that sees the same (immutable)
    config object: agents spawned with one config parse it once. A small, bounded cache."""
    hit = _PARSED.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    parsed = CompactConfig.from_mapping(config)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[id(config)] = (config, parsed)
    return parsed


__all__ = ["parse_config"]

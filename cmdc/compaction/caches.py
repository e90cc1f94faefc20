"""The compaction's process-wide caches: parsed configs and the shared journal stores."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..store.cache import _STORES, shared_store
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


__all__ = ["_STORES", "parse_config", "shared_store"]

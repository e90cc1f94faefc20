"""One `OffloadStore` per directory for the whole process (a private helper of layer 1).

Every compactor and file store writing to one directory shares its journals' locks and
sequence numbers through this cache; an entry lives while someone holds the store."""

from __future__ import annotations

import weakref
from pathlib import Path

from .file.journal import OffloadStore

_STORES: weakref.WeakValueDictionary[Path, OffloadStore] = weakref.WeakValueDictionary()


def shared_store(root: Path) -> OffloadStore:
    """The process's `OffloadStore` for the directory `root` (made on first use)."""
    store = _STORES.get(root)
    if store is None:
        store = _STORES[root] = OffloadStore(root)
    return store

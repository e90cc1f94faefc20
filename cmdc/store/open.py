"""`open_store`: the one place a store is chosen, by URL, directory or object."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from .._redact import redact_url
from .._version import install_hint
from ..errors import ConfigError
from .file.store import FileStore
from .protocol import Store

if TYPE_CHECKING:
    from .postgres.store import PostgresStore


def open_store(spec: str | os.PathLike[str] | Store) -> Store:
    """The store `spec` names: a `postgresql://` URL, a directory (the file store), or a store
    object (returned as is). Not yet started: `await store.start()` (the runtime does)."""
    postgres = sys.modules.get("cmdc.store.postgres.store")
    if isinstance(spec, FileStore) or (postgres is not None and isinstance(spec, postgres.PostgresStore)):
        return spec  # the shipped stores skip the protocol's isinstance (~20 µs: every agent's compactor asks)
    if isinstance(spec, str) and spec.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres.store import PostgresStore
        except ImportError as exc:
            raise ConfigError(
                f"a postgresql:// store needs the postgres extra: {install_hint('postgres')} ({exc})"
            ) from None
        pg: PostgresStore = PostgresStore(spec)
        return pg
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if not text or "\x00" in str(text) or "://" in str(text):
            raise ConfigError(
                f"store must be a directory, a postgresql:// URL or a store object, got {redact_url(text)!r:.80}"
            )
        return FileStore(text)
    if isinstance(spec, Store):
        return spec
    missing = [name for name in _members() if not hasattr(spec, name)]
    if len(missing) < len(_members()) // 2:  # a store object of the user's, short of some members
        raise ConfigError(
            f"{spec!r:.80} is not a store: it has no {', '.join(missing)} (the Store protocol: docs/storage.md)"
        )
    raise ConfigError(f"store must be a directory, a postgresql:// URL or a store object, got {spec!r:.80}")


def _members() -> list[str]:
    """The `Store` protocol's public members (methods, properties and attributes)."""
    names = set(dir(Store)) | {n for klass in Store.__mro__ for n in getattr(klass, "__annotations__", {})}
    return sorted(n for n in names if not n.startswith("_"))


__all__ = ["open_store"]

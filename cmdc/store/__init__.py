"""Everything durable: the `Store` protocol, the file store (`cmdc.store.file`), the
PostgreSQL store (`cmdc.store.postgres`), the search helpers both share.

The journal's rules are stated once, in docs/journal.md."""

from .protocol import Checkpoints, FileCheckpoints, FileStore, Leases, Store, StoreReport, open_store

__all__ = ["Checkpoints", "FileCheckpoints", "FileStore", "Leases", "Store", "StoreReport", "open_store"]

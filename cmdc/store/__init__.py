"""Everything durable: the typed `Store` protocol (`protocol`), the file store (`file`), the
PostgreSQL store (`postgres`, extra `postgres`), the record types both hand out (`records`),
the search ranking both share (`search`) and the one transcript renderer (`transcript`).

The journal's rules are stated once, in docs/journal.md."""

from .file.store import FileCheckpoints, FileStore
from .open import open_store
from .protocol import Checkpoints, JournalReader, Leases, OnNumbered, Store
from .records import StoreReport

__all__ = [
    "Checkpoints",
    "FileCheckpoints",
    "FileStore",
    "JournalReader",
    "Leases",
    "OnNumbered",
    "Store",
    "StoreReport",
    "open_store",
]

"""Everything durable: the typed `Store` protocol (`protocol`), the file store (`file`), the
PostgreSQL store (`postgres`, extra `postgres`), the record types both hand out (`records`),
the search ranking both share (`search`) and the one transcript renderer (`transcript`).

The journal's rules are stated once, in docs/journal.md.

`PostgresStore` needs the `postgres` extra (psycopg); it is imported on first use, so
`import cmdc.store` works without it."""

from typing import TYPE_CHECKING, Any

from .._version import install_hint
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
    "PostgresStore",
    "Store",
    "StoreReport",
    "open_store",
]

if TYPE_CHECKING:
    from .postgres.store import PostgresStore


def __getattr__(name: str) -> Any:
    if name != "PostgresStore":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from .postgres.store import PostgresStore
    except ImportError as exc:
        hint = install_hint("postgres")
        raise ImportError(f"cmdc.store.PostgresStore needs the 'postgres' extra: {hint} ({exc})") from exc
    globals()[name] = PostgresStore
    return PostgresStore

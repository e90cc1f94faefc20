"""The store protocol: everything durable (journal batches, checkpoints, leases) behind one
typed interface, which both shipped stores satisfy (checked by mypy: tests/store/test_store_protocol.py).

A runtime has one store, chosen in one place by a URL string or an object (`open_store`):

- a directory path (`"/some/dir"`, a `Path`): the file store, `cmdc.store.file.FileStore` —
  each agent's journal `<dir>/<agent>.jsonl` and its checkpoint `<dir>/<agent>.state.json`;
- `"postgresql://user@host:5432/db"`: the PostgreSQL store (`cmdc.store.postgres.PostgresStore`,
  extra `postgres`);
- any object with the methods of `Store`: used as it is.

The rules every store keeps (exactly-once attempts and commits, stable record numbers, damage
contained, what each method promises) are stated once, in docs/journal.md, and checked by one
conformance suite (tests/store/test_store.py) run against both stores shipped.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol, runtime_checkable

from ..message import Message
from ..state import State
from .records import AppendResult, JournalExtent, JournalRecord, JournalRef, StoreReport


@runtime_checkable
class Checkpoints(Protocol):
    """Each agent's last committed `State`: `save` replaces it atomically, `load` gives it back
    equal (or None), `delete` removes it (missing is fine), `agents` lists who has one."""

    async def save(self, state: State) -> object: ...

    async def load(self, agent_id: str) -> State | None: ...

    async def delete(self, agent_id: str) -> None: ...

    async def agents(self) -> list[str]: ...


@runtime_checkable
class Leases(Protocol):
    """Cross-process name leases: `open_runtime(lease_ttl=...)` keeps a name active in at most
    one runtime among all that share the store.

    - `acquire_lease(agent_id, owner, ttl=..., takeover=())` gives `owner` the name for `ttl`
      seconds and returns its fencing token (a number that grows with every grant). It raises
      `NameLeased` while another owner holds an unexpired lease, unless that owner is in
      `takeover` (owners known to be dead). The same owner acquiring again gets a new token.
    - While the store holds a lease, every write for that agent (journal append and commit,
      checkpoint save and delete) checks, in the write's own transaction, that the lease is still
      this owner's with this token, and raises `LeaseLost` otherwise: a stale owner whose lease
      expired cannot write after losing it. (The file store's leases are `flock`s the kernel
      drops when the process dies: they need neither expiry nor fencing.)
    - `renew_leases(owner, ttl=...)` extends every lease `owner` holds here and returns the
      names still held; `release_lease(agent_id, owner, token)` gives one up (only that grant:
      a later grant to the same owner is kept); `break_leases(owner)` ends all of a dead
      owner's leases at once and returns how many it ended.
    """

    async def acquire_lease(
        self, agent_id: str, owner: str, *, ttl: float, takeover: Collection[str] = ()
    ) -> int: ...

    async def renew_leases(self, owner: str, *, ttl: float) -> list[str]: ...

    async def release_lease(self, agent_id: str, owner: str, token: int) -> None: ...

    async def break_leases(self, owner: str) -> int: ...


OnNumbered = Callable[[AppendResult], object]
"""`append(on_numbered=...)`: called in trio's thread with what the append will return, once its
records are numbered (see docs/journal.md, "Exactly once")."""


@runtime_checkable
class JournalReader(Protocol):
    """The read side of a journal: what recall and the dev UI need. Every `Store` has it, and so
    has the file store's bare journal, `OffloadStore`."""

    def location(self, agent_id: str) -> str: ...

    async def records(self, agent_id: str, *, max_chars: int | None = None) -> list[JournalRecord]: ...

    async def read(self, agent_id: str) -> list[Message]: ...

    async def read_range(
        self, agent_id: str, first_seq: int, last_seq: int, *, max_chars: int | None = None
    ) -> list[JournalRecord]: ...

    async def last_records(self, agent_id: str, n: int, *, max_chars: int | None = None) -> list[JournalRecord]: ...

    async def search(
        self, agent_id: str, query: str, limit: int = 10, *, max_chars: int | None = None
    ) -> list[JournalRecord]: ...

    async def extent(self, agent_id: str) -> JournalExtent: ...


@runtime_checkable
class Store(JournalReader, Leases, Protocol):
    """Everything durable: journal, checkpoints, leases. Each method's rules: docs/journal.md.

    A store belongs to whoever opened it: that owner calls `start` before the first use and
    `aclose` when done.

    `shared`: whether several processes share the store (a database does, a directory does not):
    a runtime on a shared store leases every agent name by default (`open_runtime`).
    `agents()`: every agent the store holds a journal or a checkpoint for. `written_at(ids)`:
    when each agent's journal or checkpoint last changed (seconds since the epoch; None when
    unknown): readers such as the web page cache what they read by it."""

    shared: bool

    @property
    def checkpoints(self) -> Checkpoints: ...

    async def agents(self) -> list[str]: ...

    async def written_at(self, agent_ids: Sequence[str]) -> list[float | None]: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def append(
        self,
        agent_id: str,
        messages: Sequence[Message],
        *,
        compaction: int = 0,
        attempt: str | None = None,
        commit: bool = True,
        expect: JournalRef | None = None,
        on_numbered: OnNumbered | None = None,
    ) -> AppendResult: ...

    async def commit(self, agent_id: str, attempts: Sequence[str], *, expect: JournalRef | None = None) -> bool: ...

    async def verify(self, agent_id: str) -> StoreReport: ...

    async def repair(self, agent_id: str) -> StoreReport: ...

    async def transcript(self, agent_id: str) -> str: ...


__all__ = ["Checkpoints", "JournalReader", "Leases", "OnNumbered", "Store", "StoreReport"]

"""The store protocol: everything durable (journal batches, checkpoints) behind one interface.

A runtime has one store, chosen in one place by a URL string or an object (`open_store`):

- a directory path (`"/some/dir"`, a `Path`): the file store, `FileStore` — each agent's journal
  `<dir>/<agent>.jsonl` (the offload journal) and its checkpoint `<dir>/<agent>.state.json`;
- `"postgresql://user@host:5432/db"`: the PostgreSQL store (`cmdc.postgres.PostgresStore`,
  extra `postgres`);
- any object with the methods of `Store`: used as it is.

A store is two things. Its journal methods (`append`, `commit`, `records`, `read`, `read_range`,
`search`, `verify`, `transcript`, `location`) keep each agent's evicted messages; its
`checkpoints` (`save`, `load`, `delete`, `agents`) keep each agent's last committed `State`.
The rules every store keeps are checked by one conformance suite (tests/test_store.py), run
against both stores shipped:

- `append(agent_id, messages, compaction=n, attempt=None, commit=True, expect=None)` is
  durable when it returns, and returns an `AppendResult` whose `first_seq..last_seq` cover the
  batch; with `commit=False` the batch (of `attempt`) stays invisible until `commit(agent_id,
  attempts)` or a checkpoint of a state whose summary names the attempt;
- `expect` (a `JournalRef`: the journal id and the highest record number the caller's state
  names; the compactor passes it to every store, on `append` and `commit`): a journal that
  vanished, was replaced or holds fewer records than that raises `JournalLost` before anything
  is written, after the store recorded the loss durably (a successor journal that follows the
  lost one and numbers on past every record handed out), so the retry writes its whole batch
  and no record number is ever reused;
- each message appended for an agent is read back exactly once, at a stable record number:
  appending it again (a retried batch) neither duplicates nor renumbers it; numbers only grow;
- `records`/`read` give every visible record in seq order; `read_range` a slice by seq;
  `search` records holding any of the query's words, best first, at most `limit`;
- a store whose class sets `clips_records = True` (both shipped do) also takes `max_chars=` on
  `records`, `read_range` and `search`: a message whose text is longer comes as a copy cut to
  that many characters, its record's `clipped` counting the rest, and a huge text is never
  built whole (recall asks for this: it shows records within a budget);
- `verify` counts records and reports damage; readers skip damaged records rather than fail;
  `repair` (optional: a store without it is not repairable, and `cmdc history --repair` says
  so) moves damaged records aside, keeps every valid one at its number, and returns the
  report of the journal before the repair with `moved` set;
- `checkpoints.save(state)` replaces the agent's checkpoint atomically; `load` gives it back
  equal (or None); `delete` removes it (missing is fine); `agents()` lists who has one;
- unsafe agent ids raise `ConfigError` before anything is touched; I/O failures raise
  `OffloadError` (journal) or `CheckpointError` (checkpoints), never something else.
"""

from __future__ import annotations

import codecs
import fcntl
import itertools
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import attrs
import trio

from ._fs import refuse_linked
from ._redact import redact_url
from ._stores import shared_store
from ._version import install_hint
from .checkpoint import CheckpointStore
from .errors import ConfigError, NameLeased, StoreUnavailable
from .message import Message
from .offload import AppendResult, JournalExtent, JournalRecord, JournalReport, OffloadStore
from .state import State, validate_agent_id

if TYPE_CHECKING:
    from .postgres import PostgresStore


@attrs.frozen
class StoreReport:
    """What `verify` found in one agent's journal: visible records, committed compactions,
    records of attempts never committed, damaged records (their numbers, or -1 where none
    can be read); after a `repair`, how much damage it moved aside (`moved`: rows for the
    PostgreSQL store, bytes for the file store)."""

    agent_id: str
    journal: str | None
    records: int
    compactions: int
    uncommitted: int
    damaged: tuple[int, ...]
    moved: int = 0

    @property
    def clean(self) -> bool:
        return not self.damaged


@runtime_checkable
class Checkpoints(Protocol):
    """Each agent's last committed `State`."""

    async def save(self, state: State) -> object: ...

    async def load(self, agent_id: str) -> State | None: ...

    async def delete(self, agent_id: str) -> None: ...

    async def agents(self) -> list[str]: ...


@runtime_checkable
class Store(Protocol):
    """Everything durable; see the module docstring for the rules."""

    @property
    def checkpoints(self) -> Checkpoints: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def location(self, agent_id: str) -> str: ...

    async def append(
        self, agent_id: str, messages: Sequence[Message], *, compaction: int = 0, **options: Any
    ) -> AppendResult: ...

    async def commit(self, agent_id: str, attempts: Sequence[str], *, expect: Any = None) -> bool: ...

    async def records(self, agent_id: str) -> list[JournalRecord]: ...

    async def read(self, agent_id: str) -> list[Message]: ...

    async def read_range(self, agent_id: str, first_seq: int, last_seq: int) -> list[JournalRecord]: ...

    async def search(self, agent_id: str, query: str, limit: int = 10) -> list[JournalRecord]: ...

    async def verify(self, agent_id: str) -> StoreReport: ...

    async def transcript(self, agent_id: str) -> str: ...


@runtime_checkable
class Leases(Protocol):
    """Cross-process name leases (optional: a store that has them lets `open_runtime(lease_ttl=...)`
    keep a name active in at most one runtime among all that share the store).

    - `acquire_lease(agent_id, owner, ttl=..., takeover=())` gives `owner` the name for `ttl`
      seconds and returns its fencing token (a number that grows with every grant). It raises
      `NameLeased` while another owner holds an unexpired lease, unless that owner is in
      `takeover` (owners known to be dead). The same owner acquiring again gets a new token.
    - While the store holds a lease, every write for that agent (journal append and commit,
      checkpoint save and delete) checks, in the write's own transaction, that the lease is still
      this owner's with this token, and raises `LeaseLost` otherwise: a stale owner whose lease
      expired cannot write after losing it.
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


class FileStore:
    """The file store: journals and checkpoints as files in one directory (the default).

    A thin adapter over `OffloadStore` (the journals, shared with every `Compactor` using the
    same directory) and `CheckpointStore`."""

    clips_records: ClassVar[bool] = True

    def __init__(self, root: str | os.PathLike[str], *, write_timeout: float = 60.0) -> None:
        self.root = Path(os.path.abspath(root))
        self.journal: OffloadStore = shared_store(self.root)
        self._checkpoints = FileCheckpoints(self.root, write_timeout=write_timeout)
        self._leases: dict[str, tuple[str, int, int]] = {}  # agent -> (owner, token, locked fd)
        self._tokens = itertools.count(1)

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    @property
    def checkpoints(self) -> FileCheckpoints:
        return self._checkpoints

    async def start(self) -> None:
        """Check once that the directory is usable (created if missing, a probe file written
        and removed): `OffloadError` naming it and the cause, before any agent runs."""
        await self.journal.check_usable()

    async def aclose(self) -> None:
        return None

    def location(self, agent_id: str) -> str:
        return str(self.journal.path_for(agent_id))

    async def append(
        self, agent_id: str, messages: Sequence[Message], *, compaction: int = 0, **options: Any
    ) -> AppendResult:
        return await self.journal.append(agent_id, messages, compaction=compaction, **options)

    async def records(self, agent_id: str, *, max_chars: int | None = None) -> list[JournalRecord]:
        return await self.journal.records(agent_id, max_chars=max_chars)

    async def read(self, agent_id: str) -> list[Message]:
        return await self.journal.read(agent_id)

    async def read_range(
        self, agent_id: str, first_seq: int, last_seq: int, *, max_chars: int | None = None
    ) -> list[JournalRecord]:
        return await self.journal.read_range(agent_id, first_seq, last_seq, max_chars=max_chars)

    async def search(
        self, agent_id: str, query: str, limit: int = 10, *, max_chars: int | None = None
    ) -> list[JournalRecord]:
        return await self.journal.search(agent_id, query, limit, max_chars=max_chars)

    async def last_records(self, agent_id: str, n: int, *, max_chars: int | None = None) -> list[JournalRecord]:
        """`OffloadStore.last_records`: the last `n` records, read through the journal's index."""
        return await self.journal.last_records(agent_id, n, max_chars=max_chars)

    async def extent(self, agent_id: str) -> JournalExtent:
        """`OffloadStore.extent`: record count, first and last numbers, compactions (no record read)."""
        return await self.journal.extent(agent_id)

    async def commit(self, agent_id: str, attempts: Sequence[str], *, expect: Any = None) -> bool:
        return await self.journal.commit(agent_id, attempts, expect=expect)

    async def verify(self, agent_id: str) -> StoreReport:
        return _store_report(agent_id, await self.journal.verify(agent_id))

    async def repair(self, agent_id: str) -> StoreReport:
        """`OffloadStore.repair`: damaged lines and a torn tail go to `<agent>.jsonl.damaged`,
        every valid line stays. The report is of the journal before the repair."""
        return _store_report(agent_id, await self.journal.repair(agent_id))

    async def transcript(self, agent_id: str) -> str:
        path = await self.journal.write_transcript(agent_id)
        return await trio.to_thread.run_sync(_read_text, path)


    # -- leases: an exclusive flock on <dir>/<agent>.lease, held while the lease is -------------
    # The kernel drops the lock when the holding process dies, so a lease cannot outlive its
    # owner and needs no expiry (`ttl` is accepted and ignored) nor fencing; `break_leases` can
    # end only this store's own locks. flock works between processes of one machine sharing the
    # directory (not over most network file systems).
    async def acquire_lease(self, agent_id: str, owner: str, *, ttl: float, takeover: Collection[str] = ()) -> int:
        validate_agent_id(agent_id)
        held = self._leases.get(agent_id)
        if held is not None:
            if held[0] != owner:
                raise NameLeased(f"agent {agent_id!r} is leased to {held[0]!r} (in this process)")
            token = next(self._tokens)
            self._leases[agent_id] = (owner, token, held[2])
            return token
        path = self.root / f"{agent_id}.lease"

        def lock() -> int:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            # no symlink followed, no hard link written through (the file is truncated and
            # written): a planted one is refused, naming the file
            try:
                fd = os.open(path, _LEASE_FLAGS, 0o600)
            except OSError as exc:
                raise StoreUnavailable(f"lease file {path}: open failed: {os.strerror(exc.errno or 0)}") from None
            try:
                try:
                    refuse_linked(fd, path)
                except OSError as exc:
                    raise StoreUnavailable(f"lease file {exc}") from None
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                os.close(fd)
                raise NameLeased(f"agent {agent_id!r} is leased to {holder or 'another process'!r}") from None
            except BaseException:
                os.close(fd)
                raise
            os.ftruncate(fd, 0)
            os.pwrite(fd, owner.encode()[:200], 0)
            return fd

        fd = await trio.to_thread.run_sync(lock)
        if agent_id in self._leases:  # acquired meanwhile by this store: keep that one
            os.close(fd)
            return await self.acquire_lease(agent_id, owner, ttl=ttl, takeover=takeover)
        token = next(self._tokens)
        self._leases[agent_id] = (owner, token, fd)
        return token

    async def renew_leases(self, owner: str, *, ttl: float) -> list[str]:
        return sorted(a for a, (o, _, _) in self._leases.items() if o == owner)

    async def release_lease(self, agent_id: str, owner: str, token: int) -> None:
        held = self._leases.get(agent_id)
        if held is not None and held[:2] == (owner, token):
            del self._leases[agent_id]
            os.close(held[2])  # closing the descriptor drops the lock

    async def break_leases(self, owner: str) -> int:
        mine = [(a, t) for a, (o, t, _) in self._leases.items() if o == owner]
        for agent_id, token in mine:
            await self.release_lease(agent_id, owner, token)
        return len(mine)


def _read_text(path: Path) -> str:
    """A UTF-8 file's text, decoded a megabyte at a time (a huge file is not one long call;
    the one string is then made by one copy)."""
    data = path.read_bytes()
    decoder = codecs.getincrementaldecoder("utf-8")()
    step = 1024 * 1024
    view = memoryview(data)
    parts = [decoder.decode(view[i : i + step]) for i in range(0, len(data), step)]
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts)


def _store_report(agent_id: str, report: JournalReport) -> StoreReport:
    damaged = tuple(-1 for _ in report.damaged) + ((-1,) if report.torn else ())
    return StoreReport(
        agent_id, report.journal, report.records, report.compactions, report.uncommitted, damaged, report.moved
    )


_LEASE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class FileCheckpoints(CheckpointStore):
    """`CheckpointStore` with the protocol's `agents()`."""

    async def agents(self) -> list[str]:
        """The agents that have a checkpoint here, sorted."""

        def scan() -> list[str]:
            try:
                names = os.listdir(self.root)
            except FileNotFoundError:
                return []
            out = []
            for name in names:
                if name.endswith(".state.json") and not name.startswith("."):
                    agent = name[: -len(".state.json")]
                    try:
                        out.append(validate_agent_id(agent))
                    except ConfigError:
                        continue
            return sorted(out)

        return await trio.to_thread.run_sync(scan)


def open_store(spec: str | os.PathLike[str] | Store) -> Store:
    """The store `spec` names: a `postgresql://` URL, a directory (the file store), or a store
    object (returned as is). Not yet started: `await store.start()` (the runtime does)."""
    postgres = sys.modules.get("cmdc.postgres")
    if isinstance(spec, FileStore) or (postgres is not None and isinstance(spec, postgres.PostgresStore)):
        return spec  # the shipped stores skip the protocol's isinstance (~20 µs: every agent's compactor asks)
    if isinstance(spec, str) and spec.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresStore
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
    raise ConfigError(f"store must be a directory, a postgresql:// URL or a store object, got {spec!r:.80}")


__all__ = ["Checkpoints", "FileCheckpoints", "FileStore", "Leases", "Store", "StoreReport", "open_store"]

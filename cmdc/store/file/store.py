"""The file store: each agent's journal (`<dir>/<agent>.jsonl`, see `journal`), checkpoint
(`<dir>/<agent>.state.json`, see `checkpoints`) and lease (`<dir>/<agent>.lease`, a `flock`) in
one directory. The journal's rules: docs/journal.md."""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import itertools
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ...errors import ConfigError, NameLeased, StoreUnavailable
from ...events import EventSink
from ...message import Message
from ...state import validate_agent_id
from ..fs import refuse_linked
from ..protocol import JournalReader, OnNumbered, Store
from ..records import AppendResult, JournalExtent, JournalRecord, JournalRef, StoreReport
from .checkpoints import CheckpointStore
from .journal import JournalReport, OffloadStore


class FileStore:
    """The file store: journals, checkpoints and leases as files in one directory (the default).

    Its journals are an `OffloadStore` of its own (`journal`, closed with this store); another
    store or process writing the same directory is kept out by the files' locks. `on_event`
    receives the journal's events (`journal_lost`, `journal_damaged`, ...)."""

    def __init__(
        self, root: str | os.PathLike[str], *, write_timeout: float = 60.0, on_event: EventSink | None = None
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.journal = OffloadStore(self.root, write_timeout=write_timeout, on_event=on_event)
        self._checkpoints = FileCheckpoints(self.root, write_timeout=write_timeout)
        self._leases: dict[str, tuple[str, int, int]] = {}  # agent -> (owner, token, locked fd)
        self._tokens = itertools.count(1)

    shared: bool = False
    """One process at a time per journal (its flock); a runtime leases names only when asked."""

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    async def agents(self) -> list[str]:
        """Every agent with a journal (`<agent>.jsonl`) or a checkpoint in the directory."""
        return await trio.to_thread.run_sync(_agent_names, self.root)

    async def written_at(self, agent_ids: Sequence[str]) -> list[float | None]:
        """Each agent's latest modification time of its journal and checkpoint files."""
        ids = [validate_agent_id(a) for a in agent_ids]
        return await trio.to_thread.run_sync(_modified, self.root, ids)

    @property
    def checkpoints(self) -> FileCheckpoints:
        return self._checkpoints

    async def start(self) -> None:
        """Check once that the directory is usable (created if missing, a probe file written
        and removed): `OffloadError` naming it and the cause, before any agent runs."""
        await self.journal.check_usable()

    async def aclose(self) -> None:
        """Close the journals' open search indexes (the store stays usable: they reopen)."""
        await self.journal.aclose()

    def location(self, agent_id: str) -> str:
        return str(self.journal.path_for(agent_id))

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
    ) -> AppendResult:
        return await self.journal.append(
            agent_id,
            messages,
            compaction=compaction,
            attempt=attempt,
            commit=commit,
            expect=expect,
            on_numbered=on_numbered,
        )

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

    async def commit(self, agent_id: str, attempts: Sequence[str], *, expect: JournalRef | None = None) -> bool:
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


if TYPE_CHECKING:  # mypy checks that the file store and its bare journal satisfy the protocols
    _FILE_STORE: type[Store] = FileStore
    _JOURNAL: type[JournalReader] = OffloadStore


def _agent_names(root: Path) -> list[str]:
    try:
        entries = os.listdir(root)
    except OSError:
        return []
    names = set()
    for entry in entries:
        for suffix in (".jsonl", ".state.json"):
            if entry.endswith(suffix) and not entry.startswith("."):
                with contextlib.suppress(ConfigError):
                    names.add(validate_agent_id(entry[: -len(suffix)]))
    return sorted(names)


def _modified(root: Path, agent_ids: list[str]) -> list[float | None]:
    out: list[float | None] = []
    for agent_id in agent_ids:
        best: float | None = None
        for suffix in (".state.json", ".jsonl"):
            try:
                stamp = os.stat(root / f"{agent_id}{suffix}").st_mtime
            except (OSError, ValueError):
                continue
            best = stamp if best is None else max(best, stamp)
        out.append(best)
    return out


__all__ = ["FileCheckpoints", "FileStore"]

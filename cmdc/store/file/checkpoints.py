"""Checkpoints: each agent's last committed `State`, one file per agent, replaced atomically.

`<root>/<agent_id>.state.json` holds `State.to_json()`. A save writes a temp file beside it
(`.<agent_id>.state.json.<16 hex digits>.tmp`), fsyncs it, renames it over the target and
fsyncs the directory, so a reader, or a restart after a crash, sees the old checkpoint or the
new one, never a mix. The blocking I/O runs in a worker thread that a cancelled caller waits
for; on any failure the temp file is removed. A crash can still leave a temp file behind:
loads ignore it and the next save of that agent removes it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from ..._check import seconds
from ...errors import CheckpointCorrupted, CheckpointError, ConfigError
from ...state import State, validate_agent_id
from ..fs import DirProbe, fsync_dir, make_dirs, os_cause, refuse_linked, run_bounded, write_pieces

_SUFFIX = ".state.json"
_TEMP = re.compile(r"\.(?P<agent>.+)\.state\.json\.[0-9a-f]{16}\.tmp")  # the fixed tail makes it unambiguous
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW


def _error(path: Path, exc: OSError, doing: str) -> CheckpointError:
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return CheckpointError(f"checkpoint {path}: {doing} failed: {text}")


class CheckpointStore:
    """Each agent's last saved `State` under `root`; see the module docstring.

    Saves (and deletes) of one agent are serialized by a per-agent `trio.Lock`, which is fair:
    they reach the disk in the order they were called, so a newer save never loses to an older
    one. Agent ids are checked with `validate_agent_id` (`ConfigError`) before any file is
    touched; an `OSError` becomes a `CheckpointError` naming the path.
    """

    def __init__(self, root: str | os.PathLike[str], *, write_timeout: float = 60.0) -> None:
        self.write_timeout = seconds(write_timeout, "write_timeout")
        self.root = Path(os.path.abspath(root))  # once: a later chdir does not move checkpoints
        self._stalled: dict[str, str] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._leftovers: dict[str, list[str]] | None = None  # temp files seen by the first save
        self._scan_lock = threading.Lock()
        self._probe = DirProbe(self.root)

    def __repr__(self) -> str:
        return f"CheckpointStore({str(self.root)!r})"

    async def check_usable(self) -> None:
        """Check once that checkpoints can be written under `root` (as
        `OffloadStore.check_usable`); `CheckpointError` naming the directory and the cause."""
        if self._probe.ok:
            return
        try:
            await run_bounded(self._probe.run, limit=self.write_timeout)
        except OSError as exc:
            raise CheckpointError(f"checkpoint directory {self.root} is not usable: {os_cause(exc)}") from None
        except trio.TooSlowError:
            raise CheckpointError(
                f"checkpoint directory {self.root} is not usable: a test write took over {self.write_timeout} s"
            ) from None

    def path_for(self, agent_id: str) -> Path:
        """The checkpoint's path; raises `ConfigError` for an unsafe agent id."""
        return self.root / f"{validate_agent_id(agent_id)}{_SUFFIX}"

    @contextlib.asynccontextmanager
    async def _lock(self, agent_id: str) -> AsyncIterator[None]:
        """Hold the agent's lock; dropped when nobody holds or waits for it, so a store that
        saw a million agents does not keep a million locks."""
        lock = self._locks.get(agent_id)
        if lock is None:
            lock = self._locks[agent_id] = trio.Lock()
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._locks.get(agent_id) is lock:
                del self._locks[agent_id]

    # -- saving -------------------------------------------------------------------------------
    async def save(self, state: State) -> Path:
        """Replace the agent's checkpoint with `state`, durably; return the file's path."""
        if not isinstance(state, State):
            raise TypeError(f"save takes a State, got {type(state).__name__}")
        path = self.path_for(state.agent_id)
        async with self._lock(state.agent_id):
            if state.agent_id in self._stalled:
                raise CheckpointError(self._stalled[state.agent_id])
            # A cancelled caller waits for the save to finish, but not past write_timeout.
            try:
                # encoded in the worker too: a state holding megabytes is a long call
                return await run_bounded(self._save_sync, path, state.agent_id, state, limit=self.write_timeout)
            except trio.TooSlowError:
                # The abandoned save may still land later: no newer save may race it.
                self._stalled[state.agent_id] = (
                    f"checkpoint {path}: a save did not finish within {self.write_timeout} s "
                    "(the disk stalls); later saves are refused"
                )
                raise CheckpointError(self._stalled[state.agent_id]) from None

    def _save_sync(self, path: Path, agent_id: str, state: State) -> Path:
        data = state.json_pieces()  # a huge message is written from its own bytes, not copied
        directory = path.parent
        temp = directory / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            try:
                fd = os.open(temp, _TEMP_FLAGS, 0o600)
            except FileNotFoundError:
                make_dirs(directory)
                fd = os.open(temp, _TEMP_FLAGS, 0o600)
        except OSError as exc:
            raise _error(path, exc, "create temp file") from exc
        doing = "write"
        try:
            try:
                refuse_linked(fd, temp)  # linked in the moment since its creation: never written through
                os.fchmod(fd, 0o600)
                write_pieces(fd, data)
                doing = "fsync"
                os.fsync(fd)
            finally:
                os.close(fd)
            doing = "replace"
            os.replace(temp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if isinstance(exc, OSError):
                raise _error(path, exc, doing) from exc
            raise
        try:
            fsync_dir(directory)
        except OSError as exc:
            raise _error(path, exc, "fsync directory") from exc
        self._remove_leftovers(directory, agent_id)
        return path

    def _remove_leftovers(self, directory: Path, agent_id: str) -> None:
        """Remove temp files a crash left for `agent_id`. The directory is listed once per store
        (by its first save); each agent's leftovers are then removed by its own first save."""
        with self._scan_lock:
            if self._leftovers is None:
                self._leftovers = {}
                with contextlib.suppress(OSError):
                    for name in os.listdir(directory):
                        m = _TEMP.fullmatch(name)
                        if m is not None:
                            self._leftovers.setdefault(m["agent"], []).append(name)
            names = self._leftovers.pop(agent_id, [])
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(directory / name)

    # -- loading and deleting -----------------------------------------------------------------
    async def load(self, agent_id: str) -> State | None:
        """The agent's saved `State`, or None if it has none. A file that does not hold a valid
        `State` of this agent raises `CheckpointCorrupted`."""
        path = self.path_for(agent_id)
        return await trio.to_thread.run_sync(self._load_sync, path, agent_id)

    def _load_sync(self, path: Path, agent_id: str) -> State | None:
        try:
            with open(os.open(path, _READ_FLAGS), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _error(path, exc, "read") from exc
        try:
            state = State.from_json(data)
        except ConfigError as exc:  # whole, but its config is refused now (e.g. a key of the user's own)
            why = f"{exc} (saved before config keys were checked: rename it there)"
            raise ConfigError(f"checkpoint {path}: {why}") from exc
        except Exception as exc:  # the file is untrusted data: any failure means damage
            raise CheckpointCorrupted(f"checkpoint {path} is corrupted: {exc}") from exc
        if state.agent_id != agent_id:
            raise CheckpointCorrupted(f"checkpoint {path} holds agent {state.agent_id!r}, not {agent_id!r}")
        return state

    async def delete(self, agent_id: str) -> None:
        """Remove the agent's checkpoint (durably); a missing one is fine."""
        path = self.path_for(agent_id)
        async with self._lock(agent_id):
            await trio.to_thread.run_sync(self._delete_sync, path, abandon_on_cancel=False)

    def _delete_sync(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _error(path, exc, "delete") from exc
        try:
            fsync_dir(path.parent)
        except OSError as exc:
            raise _error(path, exc, "fsync directory") from exc


__all__ = ["CheckpointStore"]

"""Small durable-file helpers shared by the offload journal and the checkpoint store."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import secrets
import stat
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio

T = TypeVar("T")


def fsync_dir(path: Path) -> None:
    """fsync a directory, so an entry created or renamed in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """Create `directory` and any missing parents with mode 0o700 (whatever the umask),
    fsyncing each new one's parent."""
    missing: list[Path] = []
    p = directory
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)
        fsync_dir(d.parent)


def probe_dir(directory: Path) -> None:
    """Check that files can be made in `directory` (created, with its parents, if missing):
    create a probe file, write a byte, fsync it, remove it. Raises the `OSError` met."""
    make_dirs(directory)
    if not os.path.isdir(directory):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
    probe, fd = create_temp(directory / "cmdc-probe")  # .cmdc-probe.<random>.tmp
    try:
        try:
            write_all(fd, b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(probe)
        raise
    os.unlink(probe)


def os_cause(exc: OSError) -> str:
    """An `OSError` for people: its description, and the file it names."""
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return f"{text} ({exc.filename})" if exc.filename else text


class DirProbe:
    """`probe_dir` once per directory of one store, however many callers (agents spawned on
    the same directory share one probe; a failed probe is tried again by the next caller)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ok = False
        self._lock = threading.Lock()

    @classmethod
    def of(cls, directory: Path) -> DirProbe:
        """The probe of `directory` that every store on it shares while one holds it: stores of
        one directory (each agent's compactor opens its own) probe it once between them. Only
        the fact "usable" is shared, no store state."""
        with _PROBES_LOCK:
            probe = _PROBES.get(directory)
            if probe is None:
                probe = _PROBES[directory] = cls(directory)
            return probe

    def run(self) -> None:
        """Blocking: probe the directory unless that was done."""
        if self.ok:
            return
        with self._lock:
            if not self.ok:
                probe_dir(self.directory)
                self.ok = True


_PROBES: weakref.WeakValueDictionary[Path, DirProbe] = weakref.WeakValueDictionary()
_PROBES_LOCK = threading.Lock()

TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


def temp_name(path: Path) -> Path:
    """An unpredictable temp file name beside `path`: `.<name>.<16 hex digits>.tmp`."""
    return path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")


def create_temp(path: Path, mode: int = 0o600) -> tuple[Path, int]:
    """Create a new temp file beside `path` (`O_EXCL | O_NOFOLLOW`: a planted symlink or hard
    link at the name is never followed, and the name cannot be guessed in advance), with
    exactly `mode` whatever the umask. Returns its path and an fd open for writing."""
    for _ in range(8):
        temp = temp_name(path)
        try:
            fd = os.open(temp, TEMP_FLAGS, mode)
        except FileExistsError:  # pragma: no cover - 64 random bits colliding
            continue
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return temp, fd
    raise FileExistsError(errno.EEXIST, f"no free temp name beside {path}")  # pragma: no cover


JOIN_MAX = 1024 * 1024
"""A piece larger than this many bytes is written as it is, not copied into a join."""


def joined(pieces: Sequence[bytes], group: int = 4096, longest: int | None = None) -> Iterator[bytes]:
    """`pieces` in order as fewer, larger byte strings: joined `group` at a time, and a piece
    past `JOIN_MAX` bytes on its own (copying megabytes is one long call that holds the
    interpreter). `longest`: the size of the longest piece, when the caller knows it."""
    if longest is None:
        longest = max(map(len, pieces), default=0)
    if longest <= JOIN_MAX:  # the common case, without a Python step per piece
        for start in range(0, len(pieces), group):
            yield b"".join(pieces[start : start + group])
        return
    batch: list[bytes] = []
    for piece in pieces:
        big = len(piece) > JOIN_MAX
        if batch and (big or len(batch) == group):
            yield b"".join(batch)
            batch = []
        if big:
            yield piece
        else:
            batch.append(piece)
    if batch:
        yield b"".join(batch)


def write_pieces(fd: int, pieces: Sequence[bytes], group: int = 4096, longest: int | None = None) -> int:
    """Write `pieces` in order, joined as `joined` does; return the bytes written."""
    total = 0
    for chunk in joined(pieces, group, longest):
        write_all(fd, chunk)
        total += len(chunk)
    return total


def atomic_write(path: Path, data: bytes | Sequence[bytes], mode: int = 0o600) -> None:
    """Replace `path` with `data` (bytes, or pieces of it) durably: a new temp file
    (`create_temp`), written, fsync'd, renamed over `path`, and the directory fsync'd. A reader
    (or a restart after a crash) sees the old file or the new one; on any failure the temp
    file is removed."""
    temp, fd = create_temp(path, mode)
    try:
        try:
            if isinstance(data, bytes):
                write_all(fd, data)
            else:
                write_pieces(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_dir(path.parent)


def refuse_linked(fd: int, path: Path) -> None:
    """Raise `OSError` (naming `path`) unless the open `fd` is a regular file with one link.
    Checked on the descriptor, not by a stat before the open (which a swap between the two
    would defeat): a hard link planted at `path` by someone who may write the directory would
    make a write through `fd` land in the linked file, outside the store."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path} is not a regular file: refusing to write to it")
    if st.st_nlink > 1:
        raise OSError(
            f"{path} has {st.st_nlink} hard links (one planted there would make writes land in another "
            "file): refusing to write to it; remove the link"
        )


def stricter_mode(path: Path, default: int = 0o600) -> int:
    """`default`, or the permission bits of the existing file `path` when they are stricter."""
    try:
        st = os.stat(path)
    except OSError:
        return default
    return default & stat.S_IMODE(st.st_mode)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data`, however short the writes."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        view = view[n:]


_IOV_MAX = 1024  # buffers per writev (POSIX's minimum IOV_MAX is 16; Linux and the BSDs allow 1024)
with contextlib.suppress(AttributeError, ValueError, OSError):  # (no sysconf, or no such name: the default)
    _IOV_MAX = max(16, min(_IOV_MAX, os.sysconf("SC_IOV_MAX")))


def writev_all(fd: int, pieces: Sequence[bytes]) -> int:
    """Write `pieces` in order, up to `_IOV_MAX` of them per `writev` call (no copy into one
    buffer first), however short the writes; return the bytes written. Without `os.writev`
    (Windows) the pieces are joined and written."""
    if not hasattr(os, "writev"):
        return write_pieces(fd, pieces)
    total = 0
    for start in range(0, len(pieces), _IOV_MAX):
        group = pieces[start : start + _IOV_MAX]
        want = sum(map(len, group))
        n = os.writev(fd, group)
        total += want
        if n == want:
            continue
        if n < 0:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        for piece in group:  # a short write: the rest of the group one piece at a time
            if n >= len(piece):
                n -= len(piece)
                continue
            write_all(fd, piece[n:] if n else piece)
            n = 0
    return total


_WATCHERS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("cmdc_fs_watchers")


async def run_bounded(fn: Callable[..., T], *args: Any, limit: float) -> T:
    """Run the blocking `fn(*args)` in a worker thread. A caller's cancellation does not cut it
    short (a write is never left half done: the caller waits for it), but the wait is bounded:
    past `limit` seconds `trio.TooSlowError` is raised and the thread is left to finish alone.

    The bound is real time, kept by a second worker thread, whatever clock the trio run uses:
    a stalled disk is a real-world event, and a test's virtual clock (which may leap while a
    thread works) never trips it."""
    finished = threading.Event()

    def work() -> T:
        try:
            return fn(*args)
        finally:
            finished.set()

    try:
        watchers = _WATCHERS.get()
    except LookupError:  # one per run, apart from trio's default limiter: a watcher never waits for a token
        watchers = trio.CapacityLimiter(math.inf)
        _WATCHERS.set(watchers)
    timeout = None if math.isinf(limit) else limit
    stalled = trio.CancelScope()

    async def watch() -> None:
        if not await trio.to_thread.run_sync(finished.wait, timeout, limiter=watchers):
            stalled.cancel()

    failure: Exception | None = None
    with trio.CancelScope(shield=True):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            try:
                with stalled:
                    result = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
            except Exception as exc:  # raised below as itself, not inside the nursery's group
                failure = exc
            # the watcher returns as soon as the work is done: no thread is left behind
    if failure is not None:
        raise failure
    if stalled.cancelled_caught:
        raise trio.TooSlowError
    return result

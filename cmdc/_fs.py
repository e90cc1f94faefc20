"""Small durable-file helpers shared by the offload journal and the checkpoint store."""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio.testing

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


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data`, however short the writes."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        view = view[n:]


async def run_bounded(fn: Callable[..., T], *args: Any, limit: float) -> T:
    """Run the blocking `fn(*args)` in a worker thread. A caller's cancellation does not cut it
    short (a write is never left half done: the caller waits for it), but the wait is bounded:
    past `limit` seconds `trio.TooSlowError` is raised and the thread is left to finish alone.
    Under an autojumping mock clock (tests) virtual time leaps while a thread works, so there
    the wait is not bounded."""
    clock = trio.lowlevel.current_clock()
    if isinstance(clock, trio.testing.MockClock) and clock.autojump_threshold != math.inf:
        limit = math.inf
    with trio.CancelScope(shield=True), trio.fail_after(limit):
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
    raise AssertionError("unreachable: the scopes above never swallow an exception")  # pragma: no cover

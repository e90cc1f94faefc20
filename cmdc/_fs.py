"""Small durable-file helpers shared by the offload journal and the checkpoint store."""

from __future__ import annotations

import errno
import os
from pathlib import Path


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

"""A fault-injecting file layer for tests, installed by monkeypatching the `os` functions the
offload journal and the checkpoint store use.

    fs = FaultFS(tmp_path).install(monkeypatch)
    fs.fail("fsync", errno.EIO, match=".jsonl")            # the next journal fsync fails
    fs.fail("write", errno.ENOSPC, match=".jsonl", partial=True)  # half written, then ENOSPC
    fs.fail("open", errno.EACCES, match=".state.json")
    fs.power_cut()                                         # back to what was fsync'd

Only paths under `root` (and the descriptors opened on them) are watched; everything else goes
straight to the real functions.

The power-cut model is the pessimistic one POSIX allows. A file's content survives only as it
was at its last successful `fsync`. A name in a directory (a file created, renamed, removed; a
directory made) survives only as it was at the directory's last successful `fsync`: a rename or
a creation whose directory was not fsync'd is undone, and a new file whose data was never
fsync'd comes back empty. Everything under `root` when the layer is installed counts as durable.

`record_images(marker)` keeps the durable image as it stood just before every watched
operation, with `marker()` evaluated at that moment (the caller's count of acknowledged writes,
say); `restore(image, dest)` lays an image out in another directory. Together they give a
power cut at every point of a workload, from one run of it.
"""

from __future__ import annotations

import errno as errno_mod
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

_PATCHED = (
    "open",
    "write",
    "writev",
    "fsync",
    "ftruncate",
    "replace",
    "rename",
    "close",
    "pread",
    "read",
    "mkdir",
    "unlink",
)
REAL: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name in _PATCHED}

Inode = tuple[int, int]
Entry = tuple[str, Inode | None]  # ("dir", None) or ("file", inode)


@attrs.define
class Fault:
    """A fault waiting for its call: `op` on a path containing `match` fails with `errno`
    after `skip` matching calls went through, `times` times (None: for good). `partial`
    (writes only): the first failing call writes half its data and returns the short count,
    as a nearly full disk does; the calls after it fail."""

    op: str
    errno: int
    match: str = ""
    skip: int = 0
    times: int | None = 1
    partial: bool = False
    hits: int = 0  # calls that failed (or were cut short)

    @property
    def spent(self) -> bool:
        return self.times is not None and self.hits >= self.times + (1 if self.partial else 0)


@attrs.frozen
class Image:
    """What would survive a power cut at one moment: each durable directory's entries and each
    inode's fsync'd content; `marker` is what the caller's marker returned at that moment."""

    root: str
    dirs: dict[str, dict[str, Entry]]
    data: dict[Inode, bytes]
    op: int
    marker: Any = None


class FaultFS:
    """See the module docstring."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.faults: list[Fault] = []
        self.ops: list[tuple[str, str]] = []  # every watched call: (op, path)
        self.images: list[Image] | None = None
        self._marker: Callable[[], Any] | None = None
        self._fds: dict[int, str] = {}
        self._dirs: dict[str, dict[str, Entry]] = {}
        self._data: dict[Inode, bytes] = {}
        self._lock = threading.RLock()
        os.makedirs(self.root, exist_ok=True)
        self._snapshot_tree()

    # -- set up --------------------------------------------------------------------------------
    def install(self, monkeypatch: pytest.MonkeyPatch) -> FaultFS:
        for name in _PATCHED:
            monkeypatch.setattr(os, name, getattr(self, f"_{name}"))
        return self

    def fail(
        self, op: str, err: int, *, match: str = "", skip: int = 0, times: int | None = 1, partial: bool = False
    ) -> Fault:
        """Inject a fault (see `Fault`) and return it."""
        if op not in _PATCHED:
            raise ValueError(f"unknown operation {op!r}")
        fault = Fault(op, err, match, skip, times, partial)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def record_images(self, marker: Callable[[], Any] | None = None) -> None:
        """From now on keep the durable image before every watched operation (see `images`)."""
        self.images, self._marker = [], marker

    def count(self, op: str, match: str = "") -> int:
        return sum(1 for o, p in self.ops if o == op and match in p)

    # -- power -------------------------------------------------------------------------------
    def image(self) -> Image:
        with self._lock:
            return Image(
                self.root,
                {d: dict(e) for d, e in self._dirs.items()},
                dict(self._data),
                len(self.ops),
                self._marker() if self._marker is not None else None,
            )

    def power_cut(self) -> Image:
        """Replace everything under `root` by what was durable; return that image."""
        image = self.image()
        self.power_cut_to(image)
        return image

    def power_cut_to(self, image: Image) -> None:
        """Replace everything under `root` by `image` (what was durable at some earlier moment:
        a power cut then); from now on all of it counts as durable."""
        with self._lock:
            _empty(self.root)
            self._fds.clear()
            restore(image, self.root)
            self._snapshot_tree()

    # -- bookkeeping -------------------------------------------------------------------------
    def _watched(self, path: object) -> str | None:
        if isinstance(path, int):
            return self._fds.get(path)
        if not isinstance(path, (str, os.PathLike)):
            return None
        p = os.path.abspath(os.fspath(path))
        if not isinstance(p, str):
            return None
        if p == self.root or p.startswith(self.root + os.sep):
            return p
        return None

    def _snapshot_tree(self) -> None:
        self._dirs.clear()
        self._data.clear()
        for dirpath, _dirnames, _files in os.walk(self.root):
            self._dirs[dirpath] = self._entries(dirpath)
            for name, (kind, inode) in self._dirs[dirpath].items():
                if kind == "file" and inode is not None:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        self._data[inode] = f.read()

    def _entries(self, dirpath: str) -> dict[str, Entry]:
        out: dict[str, Entry] = {}
        for name in os.listdir(dirpath):
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISDIR(st.st_mode):
                out[name] = ("dir", None)
            elif stat.S_ISREG(st.st_mode):
                out[name] = ("file", (st.st_dev, st.st_ino))
        return out

    def _enter(self, op: str, path: str) -> Fault | None:
        """Log a watched call (keeping the image before it, if asked) and return the fault that
        fires on it, if one does."""
        with self._lock:
            if self.images is not None:
                self.images.append(self.image())
            self.ops.append((op, path))
            for fault in self.faults:
                if fault.op != op or fault.match not in path or fault.spent:
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                fault.hits += 1
                return fault
            return None

    @staticmethod
    def _raise(fault: Fault, path: str) -> None:
        raise OSError(fault.errno, os.strerror(fault.errno), path)

    # -- the patched functions ---------------------------------------------------------------
    def _open(self, path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        watched = self._watched(path)
        if watched is None:
            return REAL["open"](path, flags, mode, *args, **kwargs)  # type: ignore[no-any-return]
        fault = self._enter("open", watched)
        if fault is not None:
            self._raise(fault, watched)
        fd: int = REAL["open"](path, flags, mode, *args, **kwargs)
        with self._lock:
            self._fds[fd] = watched
        return fd

    def _close(self, fd: int) -> None:
        with self._lock:
            self._fds.pop(fd, None)
        REAL["close"](fd)

    def _write(self, fd: int, data: Any) -> int:
        watched = self._fds.get(fd)
        if watched is None:
            return REAL["write"](fd, data)  # type: ignore[no-any-return]
        fault = self._enter("write", watched)
        if fault is not None:
            if fault.partial and fault.hits == 1 and len(data) > 1:
                return REAL["write"](fd, bytes(data[: len(data) // 2]))  # type: ignore[no-any-return]
            self._raise(fault, watched)
        return REAL["write"](fd, data)  # type: ignore[no-any-return]

    def _writev(self, fd: int, buffers: Any) -> int:
        """A journal's batch goes out by `writev`: the same faults as `write` (op "write")."""
        watched = self._fds.get(fd)
        if watched is None:
            return REAL["writev"](fd, buffers)  # type: ignore[no-any-return]
        fault = self._enter("write", watched)
        if fault is not None:
            data = b"".join(bytes(b) for b in buffers)
            if fault.partial and fault.hits == 1 and len(data) > 1:
                return REAL["write"](fd, data[: len(data) // 2])  # type: ignore[no-any-return]
            self._raise(fault, watched)
        return REAL["writev"](fd, buffers)  # type: ignore[no-any-return]

    def _fsync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        watched = self._fds.get(fd)
        if watched is None:
            REAL["fsync"](fd)
            return
        fault = self._enter("fsync", watched)
        if fault is not None:
            self._raise(fault, watched)  # the data stays where it was: not durable
        REAL["fsync"](fd)
        st = os.fstat(fd)
        with self._lock:
            if stat.S_ISDIR(st.st_mode):
                self._dirs[watched] = self._entries(watched)
            else:
                with open(f"/proc/self/fd/{fd}", "rb") as f:
                    self._data[(st.st_dev, st.st_ino)] = f.read()

    def _ftruncate(self, fd: int, length: int) -> None:
        watched = self._fds.get(fd)
        if watched is not None:
            fault = self._enter("ftruncate", watched)
            if fault is not None:
                self._raise(fault, watched)
        REAL["ftruncate"](fd, length)

    def _pread(self, fd: int, n: int, offset: int) -> bytes:
        watched = self._fds.get(fd)
        if watched is not None:
            fault = self._enter("pread", watched)
            if fault is not None:
                self._raise(fault, watched)
        return REAL["pread"](fd, n, offset)  # type: ignore[no-any-return]

    def _read(self, fd: int, n: int) -> bytes:
        watched = self._fds.get(fd)
        if watched is not None:
            fault = self._enter("read", watched)
            if fault is not None:
                self._raise(fault, watched)
        return REAL["read"](fd, n)  # type: ignore[no-any-return]

    def _move(self, op: str, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        watched = self._watched(dst) or self._watched(src)
        if watched is not None:
            fault = self._enter(op, f"{self._watched(src)} -> {watched}")
            if fault is not None:
                self._raise(fault, watched)
        REAL[op](src, dst, *args, **kwargs)

    def _replace(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        self._move("replace", src, dst, *args, **kwargs)

    def _rename(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        self._move("rename", src, dst, *args, **kwargs)

    def _mkdir(self, path: Any, mode: int = 0o777, *args: Any, **kwargs: Any) -> None:
        watched = self._watched(path)
        if watched is not None:
            fault = self._enter("mkdir", watched)
            if fault is not None:
                self._raise(fault, watched)
        REAL["mkdir"](path, mode, *args, **kwargs)

    def _unlink(self, path: Any, *args: Any, **kwargs: Any) -> None:
        watched = self._watched(path)
        if watched is not None:
            fault = self._enter("unlink", watched)
            if fault is not None:
                self._raise(fault, watched)
        REAL["unlink"](path, *args, **kwargs)


def restore(image: Image, dest: str | os.PathLike[str]) -> None:
    """Lay out `image` under `dest` (an existing, empty directory): the durable directories,
    each file with its fsync'd content (empty if it never had any)."""
    dest = os.fspath(dest)

    def build(src: str, out: str) -> None:
        for name, (kind, inode) in image.dirs.get(src, {}).items():
            if kind == "dir":
                REAL["mkdir"](os.path.join(out, name), 0o700)
                build(os.path.join(src, name), os.path.join(out, name))
            else:
                target = os.path.join(out, name)
                with open(target, "wb") as f:
                    f.write(image.data.get(inode, b"") if inode is not None else b"")
                os.chmod(target, 0o600)

    build(image.root, dest)


def restored(image: Image, dest: Path) -> Path:
    """`image` laid out in a fresh directory `dest`; returns `dest`."""
    if dest.exists():
        _empty(str(dest))
    else:
        os.makedirs(dest)
    restore(image, dest)
    return dest


def _empty(directory: str) -> None:
    """Remove everything inside `directory`, with the real functions (nothing is logged)."""
    for dirpath, dirnames, filenames in os.walk(directory, topdown=False):
        for name in filenames:
            REAL["unlink"](os.path.join(dirpath, name))
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                REAL["unlink"](path)
            else:
                os.rmdir(path)


EIO, ENOSPC, EACCES = errno_mod.EIO, errno_mod.ENOSPC, errno_mod.EACCES


# -- checks shared by the fault, crash and load tests ------------------------------------------


def journal_lines(path: str | os.PathLike[str]) -> tuple[list[tuple[int, str]], bool]:
    """The raw message records of a journal file, `(seq, message id)` per complete line,
    committed or not, each checked (checksum, shape) by the journal's own decoder (control
    lines, the journal's identity and commit markers, are checked and left out); and whether a
    torn tail follows them. A missing file has no records."""
    from cmdc.offload import _decode_line

    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], False
    lines = data.split(b"\n")
    torn = lines.pop() != b""
    out = []
    for number, line in enumerate(lines, 1):
        record = _decode_line(line, f"{path}: line {number}").record
        if record is not None:
            out.append((record.seq, record.message.id))
    return out, torn


def summary_ranges(messages: Any) -> list[tuple[int, int]]:
    """The journal record ranges the summaries among `messages` name."""
    return [
        (m.metadata["cmdc.first_seq"], m.metadata["cmdc.last_seq"])
        for m in messages
        if m.is_summary and "cmdc.first_seq" in m.metadata
    ]


__all__ = [
    "EACCES",
    "EIO",
    "ENOSPC",
    "REAL",
    "Fault",
    "FaultFS",
    "Image",
    "journal_lines",
    "restore",
    "restored",
    "summary_ranges",
]

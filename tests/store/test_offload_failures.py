"""A journal whose disk fails: ENOSPC midway, a failed fsync, a root that is a file, EACCES, a
symlinked journal, a failed transcript."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cmdc.errors import ConfigError, OffloadError
from cmdc.offload import OffloadStore
from tests._support.fakes import REAL_FSYNC, REAL_OPEN, REAL_WRITE, check_clean, is_journal_fd, users

# -- failures -----------------------------------------------------------------------------------


async def test_enospc_midway_truncates_and_recovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = OffloadStore(tmp_path)
    first = users(2)
    await store.append("a", first)
    path = tmp_path / "a.jsonl"
    size = path.stat().st_size
    calls = {"n": 0}

    def failing_write(fd: int, data: Any) -> int:
        if not is_journal_fd(fd):
            return REAL_WRITE(fd, data)
        calls["n"] += 1
        if calls["n"] == 1:
            return REAL_WRITE(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OffloadError) as info:
        await store.append("a", users(5, "big"))
    monkeypatch.undo()
    assert calls["n"] == 2
    assert str(path) in str(info.value)
    assert os.strerror(errno.ENOSPC) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert path.stat().st_size == size
    assert await store.read("a") == first
    later = users(1, "later")
    r = await store.append("a", later)
    assert (r.first_seq, r.last_seq) == (3, 3)
    assert await store.read("a") == first + later
    check_clean(path)


async def test_fsync_failure_marks_journal_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a", users(1))

    def failing_fsync(fd: int) -> None:
        if is_journal_fd(fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    batch = users(2, "b")
    with pytest.raises(OffloadError, match="Input/output error") as info:
        await store.append("a", batch)
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    size = (tmp_path / "a.jsonl").stat().st_size
    for _ in range(2):
        with pytest.raises(OffloadError, match="refused"):
            await store.append("a", users(1, "c"))
        with pytest.raises(OffloadError):
            await store.append("a", batch)
    assert (tmp_path / "a.jsonl").stat().st_size == size
    # other agents of the same store are unaffected
    assert (await store.append("b", users(1))).written == 1
    # a new store (a restarted process) may write again; readers see each message once
    fresh = OffloadStore(tmp_path)
    await fresh.append("a", batch)
    assert [m.id for m in await fresh.read("a")][1:] == [m.id for m in batch]


async def test_root_is_a_file(tmp_path: Path) -> None:
    root = tmp_path / "file"
    root.write_text("not a dir")
    for store in (OffloadStore(root), OffloadStore(root / "sub")):
        with pytest.raises(OffloadError) as info:
            await store.append("a", users(1))
        assert isinstance(info.value.__cause__, OSError)
        assert "file" in str(info.value)
        assert os.strerror(errno.ENOTDIR) in str(info.value)
    assert root.read_text() == "not a dir"


async def test_open_eacces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if str(path).endswith(".jsonl"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return REAL_OPEN(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", denied)
    store = OffloadStore(tmp_path)
    with pytest.raises(OffloadError, match="Permission denied") as info:
        await store.append("a", users(1))
    assert info.value.__cause__ is not None
    with pytest.raises(OffloadError, match="Permission denied"):
        await store.read("a")
    monkeypatch.undo()
    assert (await store.append("a", users(1))).first_seq == 1


async def test_symlinked_journal_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "a.jsonl").symlink_to(target)
    with pytest.raises(OffloadError):
        await OffloadStore(tmp_path).append("a", users(1))
    assert target.read_bytes() == b""


async def test_transcript_failure_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if ".md" in str(path):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return REAL_OPEN(path, flags, mode, **kw)

    msgs = users(2)
    store = OffloadStore(tmp_path)
    r = await store.append("a", msgs)
    assert r.written == 2 and not (tmp_path / "a.md").exists()  # not on the append path
    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(OffloadError, match="transcript"):
        await store.write_transcript("a")
    monkeypatch.setattr(os, "open", REAL_OPEN)
    assert await OffloadStore(tmp_path).read("a") == msgs
    assert not (tmp_path / "a.md").exists()


# -- on_numbered: the records' numbers before the fsync ---------------------------------------------


async def test_on_numbered_comes_before_the_fsync_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`on_numbered` runs in trio's thread with what the append returns, while the fsync still
    runs (this fsync waits for it)."""
    store = OffloadStore(tmp_path)
    await store.append("a", users(2))
    seen: list[Any] = []
    told = threading.Event()

    def fsync(fd: int) -> None:
        if is_journal_fd(fd):
            assert told.wait(10), "on_numbered did not run during the fsync"
        REAL_FSYNC(fd)

    def on_numbered(result: Any) -> None:
        seen.append((result, threading.current_thread() is threading.main_thread()))
        told.set()

    monkeypatch.setattr(os, "fsync", fsync)
    result = await store.append("a", users(3, "more"), on_numbered=on_numbered)
    assert seen == [(result, True)] and (result.first_seq, result.last_seq) == (3, 5)


async def test_a_failing_on_numbered_is_logged_and_the_append_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = OffloadStore(tmp_path)

    def broken(result: Any) -> None:
        raise ValueError("callback bug")

    with caplog.at_level(logging.ERROR, logger="cmdc"):
        result = await store.append("a", users(2), on_numbered=broken)
    assert (result.first_seq, result.last_seq) == (1, 2) and len(await store.read("a")) == 2
    assert "on_numbered callback failed (agent a)" in caplog.text and "callback bug" in caplog.text


async def test_on_numbered_has_run_when_the_append_returns_however_late_its_thread_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The numbering is told by a thread started before the fsync (cmdc.store.file.writer); a
    loaded machine may run that thread late. The callback still runs before the append returns."""
    import time

    import cmdc.store.file.journal as journal

    in_trio = journal._in_trio

    def late(callback: Any, agent_id: str) -> Any:
        soon = in_trio(callback, agent_id)

        def slow(result: Any) -> None:  # in the thread that tells: it runs late
            time.sleep(0.2)
            soon(result)

        return slow

    monkeypatch.setattr(journal, "_in_trio", late)
    store = OffloadStore(tmp_path)
    seen: list[Any] = []
    result = await store.append("a", users(3), on_numbered=seen.append)
    assert seen == [result]


@pytest.mark.parametrize("callback", [42, "print", "async"])
async def test_an_on_numbered_that_is_no_plain_function_is_refused(tmp_path: Path, callback: Any) -> None:
    """A non-callable, or an async function (its coroutine would never be awaited), is refused
    with a ConfigError naming it, before anything is written."""
    store = OffloadStore(tmp_path)

    async def later(result: Any) -> None:
        return None

    bad = later if callback == "async" else callback
    with pytest.raises(ConfigError, match="on_numbered must be a plain"):
        await store.append("a", users(1), on_numbered=bad)
    assert not (tmp_path / "a.jsonl").exists()


# -- the batch's writev, the new journal's directory fsync ----------------------------------------

REAL_WRITEV = os.writev


async def test_short_writevs_still_write_every_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's lines go to the kernel by `writev`, which may write less than asked: the rest
    is written, byte for byte the same journal."""
    batch = users(300, "v")
    plain = OffloadStore(tmp_path / "plain")
    await plain.append("a", batch)
    calls = {"n": 0}

    def short_writev(fd: int, buffers: Any) -> int:
        calls["n"] += 1
        first = bytes(buffers[0])
        return REAL_WRITEV(fd, [first[: max(1, len(first) // 3)]])  # a third of the first buffer only

    monkeypatch.setattr(os, "writev", short_writev)
    store = OffloadStore(tmp_path / "short")
    await store.append("a", batch)
    monkeypatch.undo()
    assert calls["n"] > 0
    assert await store.read("a") == await plain.read("a") == batch
    check_clean(tmp_path / "short" / "a.jsonl")


async def test_enospc_in_a_writev_truncates_and_recovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = OffloadStore(tmp_path)
    first = users(2)
    await store.append("a", first)
    path = tmp_path / "a.jsonl"
    size = path.stat().st_size
    calls = {"n": 0}

    def short_writev(fd: int, buffers: Any) -> int:  # the disk fills up: half written, then no room
        calls["n"] += 1
        return REAL_WRITEV(fd, list(buffers)[: len(buffers) // 2])

    def failing_write(fd: int, data: Any) -> int:
        if not is_journal_fd(fd):
            return REAL_WRITE(fd, data)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "writev", short_writev)
    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OffloadError, match=os.strerror(errno.ENOSPC)):
        await store.append("a", users(300, "big"))
    monkeypatch.undo()
    assert calls["n"] == 1
    assert path.stat().st_size == size  # nothing of the failed batch stays
    later = users(1, "later")
    await store.append("a", later)
    assert await store.read("a") == first + later
    check_clean(path)


async def test_a_failed_directory_fsync_fails_the_new_journals_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new journal's directory is fsync'd by a thread of its own beside the data: its failure
    fails the append (what reached the disk is unknown) as the file's own fsync's would."""
    dir_fsyncs: list[int] = []
    file_fsyncs: list[int] = []

    def failing_fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            dir_fsyncs.append(threading.get_ident())
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        file_fsyncs.append(threading.get_ident())
        REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    store = OffloadStore(tmp_path)
    with pytest.raises(OffloadError, match="fsync failed: Input/output error"):
        await store.append("a", users(3))
    monkeypatch.undo()
    assert len(dir_fsyncs) == len(file_fsyncs) == 1 and dir_fsyncs != file_fsyncs  # beside it, in its own thread
    with pytest.raises(OffloadError, match="refused"):
        await store.append("a", users(1, "c"))
    fresh = OffloadStore(tmp_path)  # a restarted process writes again: the entry is fsync'd again
    await fresh.append("a", users(1, "d"))
    assert [m.content for m in await fresh.read("a")][-1] == users(1, "d")[0].content

"""A hard link (or symlink) planted in a store's directory by someone who may write to it: the
journal, its side file, the transcript, checkpoints and lease files are never written through
one. Where cmdc appends to or rewrites a file in place it refuses a file with more than one
link (checked on the open descriptor) with a typed error naming the file; where it replaces a
file (a temp file renamed over it) the link is replaced and the linked file stays as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cmdc.checkpoint import CheckpointStore
from cmdc.errors import CheckpointError, OffloadError, StoreUnavailable
from cmdc.message import Message
from cmdc.offload import OffloadStore
from cmdc.state import State
from cmdc.store import FileStore
from tests._support.fakes import users

AGENT = "a1"
SECRET = b"outside the store: not cmdc's to write\n"


def victim(tmp_path: Path) -> Path:
    """A file outside the store, and the store's directory beside it."""
    (tmp_path / "store").mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(SECRET)
    return outside


async def test_a_hard_link_at_a_new_journal_is_refused(tmp_path: Path) -> None:
    outside = victim(tmp_path)
    journal = tmp_path / "store" / f"{AGENT}.jsonl"
    os.link(outside, journal)
    store = OffloadStore(tmp_path / "store")
    with pytest.raises(OffloadError, match=f"{journal}.*2 hard links"):
        await store.append(AGENT, users(2))
    with pytest.raises(OffloadError, match=f"{journal}.*2 hard links"):
        await store.commit(AGENT, ["k0123456789abcdef"])
    with pytest.raises(OffloadError, match=f"{journal}.*2 hard links"):
        await store.repair(AGENT)
    assert outside.read_bytes() == SECRET
    assert not (tmp_path / "store" / f"{AGENT}.jsonl.damaged").exists()


async def test_a_symlink_at_a_journal_is_refused_and_the_error_says_so(tmp_path: Path) -> None:
    """Refused by O_NOFOLLOW, whose errno reads "Too many levels of symbolic links": the error
    says the journal is a symbolic link instead (`cmdc history` printed that errno)."""
    outside = victim(tmp_path)
    journal = tmp_path / "store" / f"{AGENT}.jsonl"
    journal.symlink_to(outside)
    store = OffloadStore(tmp_path / "store", index=False)
    for attempt in (store.records(AGENT), store.verify(AGENT), store.append(AGENT, users(1))):
        with pytest.raises(OffloadError, match=f"{journal}.*is a symbolic link") as caught:
            await attempt
        assert "Too many levels" not in str(caught.value)
    assert outside.read_bytes() == SECRET


async def test_a_hard_link_swapped_in_for_a_journal_is_refused(tmp_path: Path) -> None:
    """A journal this store already wrote, replaced by a link to another file between appends."""
    outside = victim(tmp_path)
    store = OffloadStore(tmp_path / "store")
    await store.append(AGENT, users(2))
    journal = store.path_for(AGENT)
    outside.write_bytes(journal.read_bytes())  # a copy of the journal: it even passes the checks
    before = outside.read_bytes()
    journal.unlink()
    os.link(outside, journal)
    with pytest.raises(OffloadError, match=f"{journal}.*hard links"):
        await store.append(AGENT, users(1, "later"))
    assert outside.read_bytes() == before


async def test_a_hard_link_at_the_side_file_is_refused(tmp_path: Path) -> None:
    outside = victim(tmp_path)
    store = OffloadStore(tmp_path / "store")
    msgs = users(2)
    await store.append(AGENT, msgs)
    journal = store.path_for(AGENT)
    with journal.open("ab") as f:
        f.write(b'{"message":{"id":"torn')  # a torn tail: the next writer moves it aside
    damaged = journal.read_bytes()
    side = store.side_file(AGENT)
    os.link(outside, side)
    with pytest.raises(OffloadError, match=f"{side}.*2 hard links"):
        await store.append(AGENT, users(1, "later"))
    with pytest.raises(OffloadError, match=f"{side}.*2 hard links"):
        await store.repair(AGENT)
    assert outside.read_bytes() == SECRET
    assert journal.read_bytes() == damaged  # nothing was cut from the journal either
    assert await store.read(AGENT) == msgs


async def test_a_fifo_at_the_side_file_is_an_error_not_a_hang(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path, write_timeout=30)
    await store.append(AGENT, users(1))
    with store.path_for(AGENT).open("ab") as f:
        f.write(b"torn")
    os.mkfifo(store.side_file(AGENT))
    with pytest.raises(OffloadError, match=str(store.path_for(AGENT))) as caught:
        await store.append(AGENT, users(1, "later"))
    assert "within" not in str(caught.value)  # refused at once, not the write timeout


async def test_a_hard_link_at_a_lease_file_is_refused(tmp_path: Path) -> None:
    outside = victim(tmp_path)
    lease = tmp_path / "store" / f"{AGENT}.lease"
    os.link(outside, lease)
    store = FileStore(tmp_path / "store")
    with pytest.raises(StoreUnavailable, match=f"{lease}.*2 hard links"):
        await store.acquire_lease(AGENT, "owner-1", ttl=30)
    assert outside.read_bytes() == SECRET


async def test_a_symlink_at_a_lease_file_is_refused(tmp_path: Path) -> None:
    outside = victim(tmp_path)
    lease = tmp_path / "store" / f"{AGENT}.lease"
    lease.symlink_to(outside)
    store = FileStore(tmp_path / "store")
    with pytest.raises(StoreUnavailable, match=str(lease)):
        await store.acquire_lease(AGENT, "owner-1", ttl=30)
    assert outside.read_bytes() == SECRET


async def test_a_lease_file_of_ones_own_is_taken_and_released(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    token = await store.acquire_lease(AGENT, "owner-1", ttl=30)
    assert (tmp_path / f"{AGENT}.lease").read_bytes() == b"owner-1"
    await store.release_lease(AGENT, "owner-1", token)
    assert await store.acquire_lease(AGENT, "owner-2", ttl=30) > 0  # the file is reused


async def test_a_hard_link_at_a_checkpoint_is_replaced_not_written_through(tmp_path: Path) -> None:
    outside = victim(tmp_path)
    store = CheckpointStore(tmp_path / "store")
    path = store.path_for(AGENT)
    os.link(outside, path)
    state = State(agent_id=AGENT).append(Message.user("hello"))
    assert await store.save(state) == path
    assert outside.read_bytes() == SECRET
    assert path.stat().st_nlink == 1
    loaded = await store.load(AGENT)
    assert loaded is not None and loaded.messages == state.messages


async def test_a_checkpoint_temp_file_linked_before_it_is_written_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: a link made to the new temp file between its creation and its write."""
    import cmdc.checkpoint as checkpoint

    store = CheckpointStore(tmp_path)
    real_open = os.open

    def open_then_link(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        if str(path).endswith(".tmp"):
            os.link(path, tmp_path / "grabbed")
        return fd

    monkeypatch.setattr(checkpoint.os, "open", open_then_link)
    with pytest.raises(CheckpointError, match="2 hard links"):
        await store.save(State(agent_id=AGENT).append(Message.user("secret")))
    assert (tmp_path / "grabbed").read_bytes() == b""  # nothing was written to it
    assert not store.path_for(AGENT).exists()

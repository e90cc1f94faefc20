"""Tests for agent checkpoints (cmdc.checkpoint)."""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from cmdc.checkpoint import CheckpointStore
from cmdc.errors import CheckpointCorrupted, CheckpointError, ConfigError
from cmdc.message import Message, TokenUsage, ToolCall
from cmdc.state import State

REAL_FSYNC = os.fsync
REAL_REPLACE = os.replace
REAL_WRITE = os.write


def make_state(agent_id: str = "a1", n: int = 3) -> State:
    messages = [
        Message.system("You are terse."),
        Message.user("héllo ✓"),
        Message.assistant(
            "calling",
            tool_calls=(ToolCall(id="c1", name="search", arguments={"q": "trio", "n": [1, 2.5, None]}),),
            usage=TokenUsage(input_tokens=10, output_tokens=5),
        ),
        Message.tool_result("c1", "found"),
    ]
    messages += [Message.user(f"message {i}") for i in range(n)]
    config = {"compact_trigger": [("tokens", 1000), ("messages", 50)], "compact_keep": ("messages", 4)}
    return State(agent_id=agent_id, messages=messages, config=config, compactions=2)


def temp_files(root: Path) -> list[str]:
    return [name for name in os.listdir(root) if name.endswith(".tmp")]


async def test_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    state = make_state()
    path = await store.save(state)
    assert path == tmp_path / "ckpt" / "a1.state.json"
    loaded = await store.load("a1")
    assert loaded == state
    assert loaded is not None
    assert loaded.config["compact_keep"] == ("messages", 4)
    assert loaded.config["compact_trigger"] == (("tokens", 1000), ("messages", 50))
    assert loaded.compactions == 2
    assert loaded.token_usage == state.token_usage
    assert path.read_bytes() == state.to_json()
    assert temp_files(path.parent) == []


async def test_missing_is_none_and_save_replaces(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert await store.load("a1") is None
    first = make_state()
    await store.save(first)
    second = first.append(Message.user("more"))
    await store.save(second)
    assert await store.load("a1") == second
    assert await CheckpointStore(tmp_path).load("a1") == second  # a fresh store sees it too


async def test_delete(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "missing-root")
    await store.delete("a1")  # nothing there: fine
    await store.save(make_state())
    await store.delete("a1")
    assert await store.load("a1") is None
    await store.delete("a1")


async def test_agents_are_separate(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    a, b = make_state("a"), make_state("b", n=5)
    await store.save(a)
    await store.save(b)
    assert await store.load("a") == a
    assert await store.load("b") == b


@pytest.mark.parametrize(
    ("target", "code"),
    [("fsync", errno.EIO), ("replace", errno.EIO), ("write", errno.ENOSPC)],
)
async def test_failure_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, code: int) -> None:
    store = CheckpointStore(tmp_path)
    old = make_state()
    await store.save(old)

    def fail(*args: Any) -> Any:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(f"cmdc.checkpoint.os.{target}", fail)
    with pytest.raises(CheckpointError) as info:
        await store.save(old.append(Message.user("new")))
    monkeypatch.undo()
    assert not isinstance(info.value, CheckpointCorrupted)
    assert str(tmp_path / "a1.state.json") in str(info.value)
    assert os.strerror(code) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert await store.load("a1") == old
    assert temp_files(tmp_path) == []


async def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def short(fd: int, data: Any) -> int:
        return REAL_WRITE(fd, bytes(data[:7]))

    monkeypatch.setattr("cmdc.checkpoint.os.write", short)
    store = CheckpointStore(tmp_path)
    state = make_state()
    await store.save(state)
    monkeypatch.undo()
    assert await store.load("a1") == state


async def test_cancel_during_slow_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    old = make_state()
    await store.save(old)
    new = old.append(Message.user("new"))

    def slow_fsync(fd: int) -> None:
        time.sleep(0.2)
        REAL_FSYNC(fd)

    monkeypatch.setattr("cmdc.checkpoint.os.fsync", slow_fsync)
    with trio.move_on_after(0.05):
        await store.save(new)  # the caller waits for the thread; the cancel lands afterwards
        await trio.sleep_forever()
    monkeypatch.undo()
    loaded = await store.load("a1")
    assert loaded in (old, new)  # in fact new: the save was not abandoned
    assert temp_files(tmp_path) == []


async def test_newer_save_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    base = make_state()
    states = [base.append(*(Message.user(f"x{j}") for j in range(i))) for i in range(6)]
    replaced: list[bytes] = []

    def slow_replace(src: Any, dst: Any) -> None:
        time.sleep(0.01)
        with open(src, "rb") as f:
            replaced.append(f.read())
        REAL_REPLACE(src, dst)

    monkeypatch.setattr("cmdc.checkpoint.os.replace", slow_replace)
    async with trio.open_nursery() as nursery:
        for s in states:  # each save is queued before the next one is called
            nursery.start_soon(store.save, s)
            await trio.testing.wait_all_tasks_blocked()
    monkeypatch.undo()
    assert replaced == [s.to_json() for s in states]
    assert await store.load("a1") == states[-1]


async def test_corrupt_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = tmp_path / "a1.state.json"
    good = make_state().to_json()
    cases: list[bytes] = [
        b"",
        b"{not json",
        good[: len(good) // 2],  # torn
        b"[]",
        orjson.dumps({"version": 9, "agent_id": "a1"}),
        orjson.dumps({"agent_id": "a1", "messages": [{"role": "wizard"}]}),
        orjson.dumps({"agent_id": "a1", "compactions": -1}),
        make_state("other").to_json(),  # someone else's state
    ]
    for data in cases:
        path.write_bytes(data)
        with pytest.raises(CheckpointCorrupted) as info:
            await store.load("a1")
        assert str(path) in str(info.value)
        assert isinstance(info.value, CheckpointError)


async def test_leftover_temp_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    state = make_state()
    await store.save(state)
    leftover = tmp_path / ".a1.state.json.0123456789abcdef.tmp"
    leftover.write_bytes(b"half a sta")
    other = tmp_path / ".b.state.json.0123456789abcdef.tmp"
    other.write_bytes(b"half")
    # after a crash: a new store ignores the leftovers when loading ...
    store = CheckpointStore(tmp_path)
    assert await store.load("a1") == state
    # ... and the next save of that agent removes its own
    await store.save(state)
    assert not leftover.exists()
    assert other.exists()
    await store.save(make_state("b"))
    assert not other.exists()


@pytest.mark.parametrize("agent_id", ["", "../evil", "a/b", ".hidden", "a\x00b", "x" * 129, "-lead", "sp ace", None, 7])
async def test_hostile_ids_refused(tmp_path: Path, agent_id: Any) -> None:
    root = tmp_path / "root"
    store = CheckpointStore(root)
    with pytest.raises(ConfigError):
        await store.load(agent_id)
    with pytest.raises(ConfigError):
        await store.delete(agent_id)
    with pytest.raises(ConfigError):
        store.path_for(agent_id)
    assert not root.exists()
    assert os.listdir(tmp_path) == []


async def test_permissions(tmp_path: Path) -> None:
    before = stat.S_IMODE(os.stat(tmp_path).st_mode)
    old_umask = os.umask(0o022)
    try:
        root = tmp_path / "a" / "b" / "ckpt"
        store = CheckpointStore(root)
        path = await store.save(make_state())
    finally:
        os.umask(old_umask)
    for d in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == before  # an existing parent is left alone


async def test_unreadable_file_is_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "a1.state.json").mkdir()
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError) as info:
        await store.load("a1")
    assert not isinstance(info.value, CheckpointCorrupted)
    assert "a1.state.json" in str(info.value)


async def test_symlink_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_bytes(make_state().to_json())
    (tmp_path / "a1.state.json").symlink_to(target)
    with pytest.raises(CheckpointError):
        await CheckpointStore(tmp_path).load("a1")


async def test_a_stalled_save_is_bounded_and_later_saves_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    release, entered, left = threading.Event(), threading.Event(), threading.Event()
    real_fsync = os.fsync

    def stalled(fd: int) -> None:  # a disk that does not answer until the test ends
        entered.set()
        release.wait(60)
        real_fsync(fd)
        left.set()

    store = CheckpointStore(tmp_path, write_timeout=0.2)
    state = State(agent_id="a", messages=(Message.user("hi"),))
    monkeypatch.setattr(os, "fsync", stalled)
    with pytest.raises(CheckpointError, match="did not finish within"):
        await store.save(state)
    # the save gave up while the disk still stalled: it did not wait for the fsync
    assert entered.is_set() and not left.is_set()
    with pytest.raises(CheckpointError, match="later saves are refused"):
        await store.save(state)
    release.set()
    with pytest.raises(ConfigError, match="write_timeout"):
        CheckpointStore(tmp_path, write_timeout=0)


async def test_the_write_bound_is_real_time_under_a_virtual_clock(tmp_path: Path, autojump_clock: Any) -> None:
    # The autojumping clock leaps while the worker thread writes: a bound kept on the trio
    # clock would trip at once. It is kept in real time, with no special case for test clocks.
    import threading

    store = CheckpointStore(tmp_path, write_timeout=5)
    state = State(agent_id="a", messages=(Message.user("hi"),))
    for _ in range(3):
        assert await store.save(state)
    assert await store.load("a") == state

    from cmdc._fs import run_bounded

    release = threading.Event()
    with pytest.raises(trio.TooSlowError):
        await run_bounded(release.wait, 10, limit=0.1)  # 0.1 s of real time
    release.set()
    with pytest.raises(OSError, match="disk on fire"):  # the worker's error comes out as itself

        def broken() -> None:
            raise OSError("disk on fire")

        await run_bounded(broken, limit=5)


def test_a_state_in_pieces_is_its_json() -> None:
    """A checkpoint is written from `State.json_pieces()`: joined, `to_json()` exactly."""
    from cmdc import Message, State

    empty = State(agent_id="a", config={"x-k": "é"})
    assert b"".join(empty.json_pieces()) == empty.to_json()
    state = empty.append(Message.user("one"), Message.tool_result("c", "x" * 2_000_000), Message.user("three"))
    assert b"".join(state.json_pieces()) == state.to_json()
    assert State.from_json(b"".join(state.json_pieces())) == state


async def test_a_checkpoint_with_a_key_refused_now_says_so_and_is_not_called_corrupted(tmp_path: Path) -> None:
    """A checkpoint saved before config keys were checked (a key of the user's own, not
    namespaced) is whole: loading it names the key and what to do (`ConfigError`), never
    `CheckpointCorrupted`."""
    store = CheckpointStore(tmp_path)
    await store.save(State(agent_id="a1", config={"x-app": 1}))
    path = store.path_for("a1")
    data = orjson.loads(path.read_bytes())
    data["config"]["foo"] = 1
    path.write_bytes(orjson.dumps(data))
    with pytest.raises(ConfigError, match=r"'foo'.*rename it there") as caught:
        await store.load("a1")
    assert not isinstance(caught.value, CheckpointCorrupted)

"""Power loss and disk faults under the offload journal and the checkpoint store (tests/_support/faultfs.py).

Each fault (ENOSPC, ENOSPC after a short write, EIO from fsync, EACCES from open, EIO from
pread, ftruncate or rename) leaves the caller's `State` unchanged, through the `Compactor` and
through an agent's turn; no acknowledged record is lost, not even by a power cut afterwards;
a failed fsync marks the journal failed: later appends are refused at once, never retried. A
power cut at every file operation of a workload leaves a journal that parses and holds every
acknowledged record, and a checkpoint that is the last saved state (or the one being saved)
and names only records on disk.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes import check_pairs, grow
from faultfs import EACCES, EIO, ENOSPC, FaultFS, journal_lines, restored, summary_ranges

from cmdc import (
    CmdcError,
    Compacted,
    CompactionError,
    Compactor,
    ExtractiveSummarizer,
    Message,
    OffloadError,
    OffloadStore,
    State,
    ToolCall,
    open_runtime,
    tool,
)
from cmdc.checkpoint import CheckpointStore
from cmdc.errors import CheckpointCorrupted, CheckpointError
from cmdc.providers import ScriptedProvider

AGENT = "a1"


def config(root: Path, **extra: Any) -> dict[str, Any]:
    return {
        "compact_offload_dir": str(root / "offload"),
        "compact_keep": ("messages", 4),
        "compact_trigger": ("messages", 10_000),
        **extra,
    }


def journal_path(root: Path) -> Path:
    return root / "offload" / f"{AGENT}.jsonl"


class Ledger:
    """What the caller was told is durable: journal records and message ids."""

    def __init__(self) -> None:
        self.records: list[tuple[int, str]] = []
        self.evicted: set[str] = set()

    def compacted(self, root: Path, before: State, outcome: Compacted) -> None:
        report = outcome.report
        lines, _ = journal_lines(journal_path(root))
        self.records += [
            (s, i) for s, i in lines if report.first_seq <= s <= report.last_seq and (s, i) not in self.records
        ]
        kept = {m.id for m in outcome.state.messages}
        self.evicted |= {m.id for m in before.messages if m.id not in kept}

    def check(self, directory: Path, upto: int | None = None) -> list[tuple[int, str]]:
        """The journal under `directory` parses and holds every acknowledged record."""
        lines, _ = journal_lines(directory / f"{AGENT}.jsonl")
        seqs = [s for s, _ in lines]
        assert seqs == sorted(set(seqs)), "seqs must increase strictly"
        present = set(lines)
        for record in self.records[:upto]:
            assert record in present, f"acknowledged record {record} lost"
        return lines


async def compact(compactor: Compactor, state: State, ledger: Ledger, root: Path) -> State:
    outcome = await compactor.force_compact(state)
    assert isinstance(outcome, Compacted)
    ledger.compacted(root, state, outcome)
    return outcome.state


async def reader_ids(directory: Path) -> list[str]:
    return [m.id for m in await OffloadStore(directory).read(AGENT)]


# -- the journal, through the Compactor -------------------------------------------------------

JOURNAL_FAULTS: dict[str, list[dict[str, Any]]] = {
    "enospc": [{"op": "write", "err": ENOSPC}],
    "enospc-after-short-write": [{"op": "write", "err": ENOSPC, "partial": True}],
    "eio-fsync": [{"op": "fsync", "err": EIO}],
    "eacces-open": [{"op": "open", "err": EACCES}],
    "eio-pread": [{"op": "pread", "err": EIO}],
    "eio-ftruncate-after-enospc": [
        {"op": "write", "err": ENOSPC, "partial": True},
        {"op": "ftruncate", "err": EIO},
    ],
}
MARKS_FAILED = {"eio-fsync", "eio-ftruncate-after-enospc"}


@pytest.mark.parametrize("name", list(JOURNAL_FAULTS))
async def test_journal_fault_changes_nothing_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    ledger = Ledger()
    state = State(agent_id=AGENT, messages=(Message.system("You are terse."),), config=config(root))
    compactor = Compactor(retries=0)
    for r in range(2):
        state = await compact(compactor, grow(grow(state, 2 * r), 2 * r + 1), ledger, root)
    state = grow(grow(state, 4, size=40_000), 5)  # a batch larger than one write
    del compactor
    compactor = Compactor(retries=0)
    before, before_json = state, state.to_json()
    size = journal_path(root).stat().st_size
    for spec in JOURNAL_FAULTS[name]:
        fs.fail(spec["op"], spec["err"], match=".jsonl", partial=spec.get("partial", False))

    with pytest.raises((CompactionError, OffloadError)) as info:
        await compactor.force_compact(state)
    assert isinstance(info.value, CmdcError)
    assert "a1.jsonl" in str(info.value)
    assert state is before and state.to_json() == before_json  # the caller's State is untouched
    ledger.check(root / "offload")
    if name in ("enospc", "enospc-after-short-write", "eacces-open", "eio-pread"):
        assert journal_path(root).stat().st_size == size  # nothing half written stays

    fs.clear()
    if name in MARKS_FAILED:
        # The journal is failed: refused at once, nothing touched, never retried.
        before_ops = len(fs.ops)
        for _ in range(2):
            with pytest.raises(OffloadError, match=r"a1\.jsonl"):
                await compactor.force_compact(state)
        assert fs.ops[before_ops:] == []
    else:  # the disk came back: the same compaction works in the same process
        retried = await compact(compactor, state, ledger, root)

    # A power cut now keeps every acknowledged record, and the journal still parses.
    fs.power_cut()
    ledger.check(root / "offload")
    assert ledger.evicted <= set(await reader_ids(root / "offload"))
    if name in MARKS_FAILED:  # a restarted process may write again
        compactor = Compactor(retries=0)
        retried = await compact(compactor, state, ledger, root)
    lines = ledger.check(root / "offload")
    assert ledger.evicted <= set(await reader_ids(root / "offload"))
    assert not journal_lines(journal_path(root))[1]
    on_disk = {s for s, _ in lines}
    for first, last in summary_ranges(retried.messages):
        assert set(range(first, last + 1)) <= on_disk
    check_pairs(retried.messages, retried.messages)


async def test_failed_fsync_is_never_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    store = OffloadStore(root / "offload")
    first = [Message.user(f"m{i}") for i in range(3)]
    await store.append(AGENT, first)
    fs.fail("fsync", EIO, match=".jsonl", times=None)  # the disk stays broken
    fsyncs = fs.count("fsync", ".jsonl")
    with pytest.raises(OffloadError, match="fsync"):
        await store.append(AGENT, [Message.user("lost")])
    assert fs.count("fsync", ".jsonl") == fsyncs + 1  # one try, no retry loop
    fs.clear()  # the disk came back: still refused, the pages behind that fsync are unknown
    ops = len(fs.ops)
    for batch in ([Message.user("later")], first, []):
        with pytest.raises(OffloadError, match="refused"):
            await store.append(AGENT, batch)
    assert fs.ops[ops:] == []  # refused before any file operation
    assert (await store.append("b2", [Message.user("other agent")])).written == 1  # others go on
    fs.power_cut()
    assert await reader_ids(root / "offload") == [m.id for m in first]


async def test_power_cut_after_acknowledged_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    ledger = Ledger()
    checkpoints = CheckpointStore(root / "ckpt")
    state = State(agent_id=AGENT, messages=(Message.system("s"),), config=config(root))
    compactor = Compactor(retries=0)
    for r in range(5):
        state = await compact(compactor, grow(grow(state, 2 * r), 2 * r + 1), ledger, root)
        await checkpoints.save(state)
    # Written but not acknowledged: a compaction whose fsync never happened.
    fs.fail("fsync", EIO, match=".jsonl")
    with pytest.raises(OffloadError):
        await compactor.force_compact(grow(grow(state, 90), 91))
    fs.power_cut()
    lines = ledger.check(root / "offload")
    assert len(lines) == len(ledger.records)  # exactly the acknowledged records
    loaded = await CheckpointStore(root / "ckpt").load(AGENT)
    assert loaded == state
    for first, last in summary_ranges(loaded.messages):
        assert set(range(first, last + 1)) <= {s for s, _ in lines}
    assert set(await reader_ids(root / "offload")) == ledger.evicted


async def test_power_cut_at_every_operation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One workload (the journal and checkpoint directories made, three compactions each
    followed by a checkpoint save), then the durable image just before each file operation of
    it, as a power cut at that moment would leave the disk."""
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    ledger = Ledger()
    saved: list[State] = []
    saving: list[State] = []
    fs.record_images(lambda: (len(ledger.records), len(saved), len(saving)))
    checkpoints = CheckpointStore(root / "ckpt")
    state = State(agent_id=AGENT, messages=(Message.system("s"),), config=config(root))
    compactor = Compactor(retries=0)
    for r in range(3):
        state = await compact(compactor, grow(grow(state, 2 * r), 2 * r + 1), ledger, root)
        saving.append(state)
        await checkpoints.save(state)
        saved.append(state)
    images = fs.images
    assert images is not None
    assert len(images) > 30
    fs.images = None
    cuts = {"total": 0, "with_records": 0, "with_checkpoint": 0}
    for image in images:
        acked, n_saved, n_saving = image.marker
        dest = restored(image, tmp_path / "cut")
        lines = ledger.check(dest / "offload", upto=acked)
        loaded = await CheckpointStore(dest / "ckpt").load(AGENT)
        if n_saved:
            assert loaded is not None
            assert loaded.to_json() in {s.to_json() for s in saving[n_saved - 1 : n_saving]}
        elif loaded is not None:
            assert n_saving and loaded.to_json() == saving[0].to_json()
        if loaded is not None:
            for first, last in summary_ranges(loaded.messages):
                assert set(range(first, last + 1)) <= {s for s, _ in lines}
            cuts["with_checkpoint"] += 1
        # Recovery: a new process appends (truncating any torn tail) and reads everything back.
        store = OffloadStore(dest / "offload")
        probe = Message.user("after the power cut")
        result = await store.append(AGENT, [probe])
        after, torn = journal_lines(dest / "offload" / f"{AGENT}.jsonl")
        assert not torn and after[-1] == (result.first_seq, probe.id)
        assert [s for s, _ in after] == list(range(1, len(after) + 1))  # no gap, no duplicate
        cuts["total"] += 1
        cuts["with_records"] += bool(lines)
    print("power cuts (compactor + checkpoints):", cuts)
    assert cuts["with_records"] and cuts["with_checkpoint"]


# -- the checkpoint store -----------------------------------------------------------------------

CHECKPOINT_FAULTS: dict[str, dict[str, Any]] = {
    "enospc": {"op": "write", "err": ENOSPC},
    "enospc-after-short-write": {"op": "write", "err": ENOSPC, "partial": True},
    "eio-fsync": {"op": "fsync", "err": EIO, "match": ".tmp"},
    "eacces-open": {"op": "open", "err": EACCES, "match": ".tmp"},
    "eio-rename": {"op": "replace", "err": EIO},
    "eio-directory-fsync": {"op": "fsync", "err": EIO, "skip": 1},
}


def checkpoint_state(root: Path, rounds: int) -> State:
    state = State(agent_id=AGENT, messages=(Message.system("s"),), config=config(root))
    for r in range(rounds):
        state = grow(state, r, size=2_000)
    return state


@pytest.mark.parametrize("name", list(CHECKPOINT_FAULTS))
async def test_checkpoint_fault_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    store = CheckpointStore(root / "ckpt")
    old = checkpoint_state(root, 2)
    await store.save(old)
    new = grow(old, 5, size=50_000)
    spec = dict(CHECKPOINT_FAULTS[name])
    fs.fail(spec.pop("op"), spec.pop("err"), match=spec.pop("match", "ckpt"), **spec)
    with pytest.raises(CheckpointError) as info:
        await store.save(new)
    assert not isinstance(info.value, CheckpointCorrupted)
    loaded = await store.load(AGENT)
    if name == "eio-directory-fsync":  # renamed, not yet durable: either one, never a mix
        assert loaded in (old, new)
    else:
        assert loaded == old
    assert [p.name for p in (root / "ckpt").iterdir()] == [f"{AGENT}.state.json"]
    fs.clear()
    fs.power_cut()
    assert await CheckpointStore(root / "ckpt").load(AGENT) == old
    await store.save(new)  # the disk came back: saving works again
    fs.power_cut()
    assert await CheckpointStore(root / "ckpt").load(AGENT) == new


async def test_checkpoint_first_save_cannot_make_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    fs.fail("mkdir", ENOSPC)
    store = CheckpointStore(root / "deep" / "ckpt")
    with pytest.raises(CheckpointError, match="No space"):
        await store.save(checkpoint_state(root, 1))
    assert await store.load(AGENT) is None
    fs.power_cut()
    assert await CheckpointStore(root / "deep" / "ckpt").load(AGENT) is None


# -- through an agent's turn --------------------------------------------------------------------


def agent_config(root: Path) -> dict[str, Any]:
    return config(root, compact_trigger=("messages", 12), compact_keep=("messages", 3))


async def spawn(rt: Any, root: Path, *, resume: bool = False) -> Any:
    @tool
    async def read_file(path: str) -> str:
        """Read a file."""
        return f"contents of {path} " + "z" * 200

    ids = itertools.count(1)

    def reply(request: Any) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            call = ToolCall(id=f"k{next(ids)}", name="read_file", arguments={"path": "a.py"})
            return Message.assistant("", tool_calls=(call,))
        return Message.assistant("done: " + last.text[:20])

    return await rt.spawn(
        AGENT,
        ScriptedProvider([reply], cycle=True),
        tools=[read_file],
        config=agent_config(root),
        summarizer=ExtractiveSummarizer(),
        resume=resume,
    )


@pytest.mark.parametrize("name", ["eio-fsync", "enospc-after-short-write", "eacces-open"])
async def test_turn_with_a_journal_fault_keeps_every_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    async with open_runtime(checkpoint_dir=root / "ckpt", log_events=False) as rt:
        agent = await spawn(rt, root)
        for turn in range(3):  # up to 12 messages: the next turn compacts
            await agent.prompt(f"turn {turn}")
        before = await agent.state()
        assert before.compactions == 0
        spec = JOURNAL_FAULTS[name][0]
        fs.fail(spec["op"], spec["err"], match=".jsonl", partial=spec.get("partial", False))
        reply = await agent.prompt("turn 3")  # the automatic compaction fails; the turn goes on
        assert reply.text.startswith("done")
        after = await agent.state()
        assert after.compactions == 0
        assert after.messages[: len(before.messages)] == before.messages  # nothing evicted, nothing lost
        check_pairs(after.messages, after.messages)
        assert await CheckpointStore(root / "ckpt").load(AGENT) == after
        fs.clear()
    fs.power_cut()
    assert await CheckpointStore(root / "ckpt").load(AGENT) == after
    journal, _ = journal_lines(journal_path(root))
    assert journal == []  # no compaction was acknowledged: nothing had to survive
    async with open_runtime(checkpoint_dir=root / "ckpt", log_events=False) as rt:
        agent = await spawn(rt, root, resume=True)
        await agent.prompt("turn 4")
        state = await agent.state()
        assert state.compactions >= 1
        on_disk = {s for s, _ in journal_lines(journal_path(root))[0]}
        for first, last in summary_ranges(state.messages):
            assert set(range(first, last + 1)) <= on_disk
        evicted = {m.id for m in after.messages} - {m.id for m in state.messages}
        assert evicted <= set(await reader_ids(root / "offload"))


@pytest.mark.parametrize("name", ["enospc", "eio-fsync", "eio-rename"])
async def test_turn_with_a_checkpoint_fault_keeps_the_last_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    async with open_runtime(checkpoint_dir=root / "ckpt", log_events=False) as rt:
        agent = await spawn(rt, root)
        await agent.prompt("turn 0")
        before = await agent.state()
        spec = dict(CHECKPOINT_FAULTS[name])
        fs.fail(spec.pop("op"), spec.pop("err"), match=spec.pop("match", "ckpt"), **spec)
        with pytest.raises(CheckpointError):
            await agent.prompt("turn 1")
        assert await agent.state() is before  # the commit did not happen
        assert await CheckpointStore(root / "ckpt").load(AGENT) == before
        fs.clear()
        for turn in range(2, 6):  # the agent carries on, compacting as it goes
            await agent.prompt(f"turn {turn}")
        final = await agent.state()
        assert final.compactions >= 1
        check_pairs(final.messages, final.messages)
    fs.power_cut()
    assert await CheckpointStore(root / "ckpt").load(AGENT) == final


async def test_no_fault_leaks_to_another_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    fs.fail("fsync", EIO, match=f"{AGENT}.jsonl", times=None)
    sick = State(agent_id=AGENT, messages=(Message.system("s"),), config=config(root))
    well = State(agent_id="b2", messages=(Message.system("s"),), config=config(root))
    compactor = Compactor(retries=0)
    with trio.fail_after(10):
        for r in range(3):
            with pytest.raises(OffloadError):
                await compactor.force_compact(grow(grow(sick, 2 * r), 2 * r + 1))
            outcome = await compactor.force_compact(grow(grow(well, 2 * r), 2 * r + 1))
            assert isinstance(outcome, Compacted)
            well = outcome.state
    assert well.compactions == 3


async def test_power_cut_at_every_operation_of_agent_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent with checkpoints runs turns that compact; the disk is cut back to its durable
    image before each file operation, and the agent resumes from what survived: a checkpoint
    that names only records on disk, nothing of an acknowledged turn lost, and it carries on."""
    root = tmp_path / "disk"
    fs = FaultFS(root).install(monkeypatch)
    acknowledged: list[State] = []
    fs.record_images(lambda: len(acknowledged))
    async with open_runtime(checkpoint_dir=root / "ckpt", log_events=False) as rt:
        agent = await spawn(rt, root)
        for turn in range(6):
            await agent.prompt(f"turn {turn}")
            acknowledged.append(await agent.state())
    assert acknowledged[-1].compactions >= 1
    images, fs.images = fs.images, None
    assert images is not None
    for image in images:
        fs.power_cut_to(image)
        async with open_runtime(checkpoint_dir=root / "ckpt", log_events=False) as rt:
            agent = await spawn(rt, root, resume=True)
            state = await agent.state()
            lines, _ = journal_lines(journal_path(root))
            for first, last in summary_ranges(state.messages):
                assert set(range(first, last + 1)) <= {s for s, _ in lines}
            check_pairs(state.messages, state.messages)
            if image.marker:
                kept = {m.id for m in state.messages} | set(await reader_ids(root / "offload"))
                assert {m.id for m in acknowledged[image.marker - 1].messages} <= kept
                assert state.compactions >= acknowledged[image.marker - 1].compactions
            reply = await agent.prompt("after the power cut")  # and it carries on
            assert reply.text.startswith("done")
    print("power cuts (agent turns):", len(images))

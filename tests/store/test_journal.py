"""The journal is the source of truth: exactly once, stable record numbers, survives damage.

Each scenario of issue 11 ends the same way: every acknowledged (committed) message is readable
exactly once, at the record number it was given, and the agent (or compactor) goes on serving.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

import cmdc._fs as fs_module
from cmdc import Compacted, Compactor, ExtractiveSummarizer, Message, OffloadStore, State, ToolCall, open_runtime, tool
from cmdc.checkpoint import CheckpointStore
from cmdc.cli import main
from cmdc.errors import CompactionError, ContextOverflow, JournalLost, OffloadError
from cmdc.events import Event
from cmdc.offload import JournalRef
from cmdc.providers import ModelRequest
from tests._support.fakes import grow

AGENT = "a1"


def conversation(offload: Path, rounds: int = 5) -> State:
    state = State(
        agent_id=AGENT,
        messages=(Message.system("You are terse."),),
        config={"compact_offload_dir": str(offload), "compact_keep": ("messages", 4)},
    )
    for r in range(rounds):
        state = grow(state, r, size=200)
    return state


def evicted(before: State, after: State) -> list[Message]:
    kept = {m.id for m in after.messages}
    return [m for m in before.messages if m.id not in kept]


async def check_once(store: OffloadStore, agent: str, expected: list[Message]) -> None:
    """Every message of `expected` readable exactly once, through every reader."""
    records = await store.records(agent)
    ids = [r.message.id for r in records]
    assert len(ids) == len(set(ids)), "a message is read twice"
    assert {m.id for m in expected} <= set(ids), "an acknowledged message is missing"
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    for m in expected:
        r = next(r for r in records if r.message.id == m.id)
        assert [x.message.id for x in await store.read_range(agent, r.seq, r.seq)] == [m.id]


class FailingOnce:
    """A summarizer that fails its first `n` calls, then summarizes."""

    def __init__(self, n: int = 1) -> None:
        self.n = n

    async def __call__(self, messages: Any, instruction: str) -> str:
        if self.n > 0:
            self.n -= 1
            raise RuntimeError("the summarizer is down")
        return "summary of " + ", ".join(m.text[:10] for m in messages)


# -- exactly once -------------------------------------------------------------------------------


async def test_journal_deleted_between_a_failed_and_a_retried_compaction(tmp_path: Path) -> None:
    offload = tmp_path / "offload"
    state = conversation(offload, 5)
    events: list[Event] = []
    compactor = Compactor(FailingOnce(), retries=0, on_event=events.append)
    with pytest.raises(CompactionError):
        await compactor.force_compact(state)  # the batch is written, never committed
    assert await OffloadStore(offload).read(AGENT) == []
    shutil.rmtree(offload)  # a clean-up between the failure and the retry
    with pytest.raises(JournalLost) as info:
        await compactor.force_compact(state)  # detected before anything is appended
    assert info.value.why == "vanished"
    assert any(e.kind == "journal_lost" for e in events)
    outcome = await compactor.force_compact(state)  # the retry writes the whole batch again
    assert isinstance(outcome, Compacted)
    gone = evicted(state, outcome.state)
    assert outcome.report.evicted == len(gone) > 10
    await check_once(OffloadStore(offload), AGENT, gone)
    assert len(await OffloadStore(offload).read(AGENT)) == len(gone)
    assert outcome.state.journal_id is not None and outcome.state.journal_seq == outcome.report.last_seq


async def test_a_retry_reuses_the_records_of_the_failed_attempt(tmp_path: Path) -> None:
    offload = tmp_path / "offload"
    state = conversation(offload, 5)
    compactor = Compactor(FailingOnce(2), retries=0)
    for _ in range(2):
        with pytest.raises(CompactionError):
            await compactor.force_compact(state)
    grown = grow(state, 9, size=200)
    outcome = await compactor.force_compact(grown)  # retried, and grown
    assert isinstance(outcome, Compacted)
    report = await OffloadStore(offload).verify(AGENT)
    assert report.uncommitted == 0 and report.duplicates == 0  # the failed batch was reused, not rewritten
    assert report.records == outcome.report.evicted and report.compactions == 1
    await check_once(OffloadStore(offload), AGENT, evicted(grown, outcome.state))


async def test_appending_what_is_journaled_is_idempotent(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    msgs = [Message.user(f"m{i}") for i in range(4)]
    first = await store.append(AGENT, msgs)
    size = (tmp_path / f"{AGENT}.jsonl").stat().st_size
    for store_ in (store, OffloadStore(tmp_path)):  # this process, and a new one
        again = await store_.append(AGENT, msgs)
        assert again.written == 0 and again.seqs == first.seqs
    assert (tmp_path / f"{AGENT}.jsonl").stat().st_size == size  # not a byte written
    changed = msgs[0].evolve(content="other content, same id")
    r = await store.append(AGENT, [changed])
    assert r.written == 1  # not the same message: a new record, the first one stays its address
    assert [m.text for m in await store.read(AGENT)] == ["m0", "m1", "m2", "m3"]


@tool
async def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path} " + "z" * 3000


class Model:
    """Asks for a tool once per user message, then answers; overflows while `overflow` is set."""

    def __init__(self) -> None:
        self.overflow = False
        self.calls = 0

    async def complete(self, request: ModelRequest) -> Message:
        await trio.lowlevel.checkpoint()
        if self.overflow:
            raise ContextOverflow("prompt is too long", prompt_tokens=999_999, limit=1_000)
        self.calls += 1
        last = request.messages[-1]
        if last.role == "user":
            return Message.assistant(
                "", tool_calls=(ToolCall(id=f"t{self.calls}", name="read_file", arguments={"path": "a"}),)
            )
        return Message.assistant("done: " + last.text[:12])


def agent_config(offload: Path | str, **extra: Any) -> dict[str, Any]:
    return {
        "compact_offload_dir": str(offload),
        "compact_keep": ("messages", 4),
        "compact_trigger": ("messages", 12),
        **extra,
    }


async def test_failed_forced_compactions_never_show(tmp_path: Path) -> None:
    offload = tmp_path / "offload"
    model = Model()
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            AGENT,
            model,
            tools=[read_file],
            summarizer=ExtractiveSummarizer(),
            # no masking: an overflow masks old results (a committed batch) before it forces a compaction
            config=agent_config(offload, compact_trigger=("messages", 10_000), mask_tool_results=False),
        )
        for i in range(4):
            await agent.prompt(f"task {i}")
        model.overflow = True  # every request overflows: forced compactions, then the turn fails
        for i in range(3):
            with pytest.raises(ContextOverflow):
                await agent.prompt(f"too long {i}")
        state = await agent.state()
        assert state.compactions == 0
        report = await OffloadStore(offload).verify(AGENT)
        assert report.records == 0 and report.compactions == 0 and report.uncommitted > 0
        model.overflow = False
        await agent.prompt("carry on")  # the agent serves; a forced compaction now commits
        await agent.compact()
        state = await agent.state()
        assert state.compactions == 1
    report = await OffloadStore(offload).verify(AGENT)
    assert report.compactions == 1 and report.duplicates == 0
    records = await OffloadStore(offload).records(AGENT)
    assert {r.compaction for r in records} == {1}
    summary = next(m for m in state.messages if m.is_summary)
    assert (summary.metadata["cmdc.first_seq"], summary.metadata["cmdc.last_seq"]) == (records[0].seq, records[-1].seq)


def chat_file(path: Path, rounds: int = 12) -> Path:
    lines = [{"role": "system", "content": "You are terse."}]
    for i in range(rounds):
        lines += [
            {"role": "user", "content": f"question {i} " + "q" * 200},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def test_cmdc_compact_three_times_journals_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chat = chat_file(tmp_path / "chat.jsonl")
    directory = tmp_path / ".cmdc" / "conversation_history"
    journal = directory / "chat.jsonl"
    sizes = []
    for _ in range(3):
        assert main(["compact", str(chat), "--keep", "4"]) == 0
        sizes.append(journal.stat().st_size)
    assert sizes[0] == sizes[1] == sizes[2]  # the second and third runs wrote nothing
    records = trio.run(OffloadStore(directory).records, "chat")
    assert len({r.message.id for r in records}) == len(records) > 10
    capsys.readouterr()
    assert main(["history", str(directory), "chat"]) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert f"{len(records)} records from 1 compaction(s)" in out, out
    assert main(["history", str(directory), "chat", "--search", "question"]) == 0
    hits = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert len(hits) == len(set(hits)) > 0  # each hit once


async def test_two_runs_of_one_agent_id_count_every_compaction(tmp_path: Path) -> None:
    offload = tmp_path / "offload"
    total = 0
    for _run in range(2):
        async with open_runtime(log_events=False) as rt:
            agent = await rt.spawn(
                AGENT, Model(), tools=[read_file], summarizer=ExtractiveSummarizer(), config=agent_config(offload)
            )
            for i in range(8):
                await agent.prompt(f"task {i}")
            total += (await agent.state()).compactions
    assert total >= 4
    report = await OffloadStore(offload).verify(AGENT)
    assert report.compactions == total and report.duplicates == 0 and report.uncommitted == 0


# -- stable addresses ---------------------------------------------------------------------------


async def test_directory_deleted_while_the_agent_runs(tmp_path: Path) -> None:
    offload = tmp_path / "offload"
    events: list[Event] = []
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            AGENT,
            Model(),
            tools=[read_file],
            summarizer=ExtractiveSummarizer(),
            config=agent_config(offload),
            compaction_cooldown=0.001,
        )
        with rt.subscribe(AGENT) as sub:

            async def collect() -> None:
                async for e in sub:
                    events.append(e)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                for i in range(6):
                    await agent.prompt(f"task {i}")
                before = await agent.state()
                assert before.compactions >= 1 and before.journal_seq > 0
                shutil.rmtree(offload)  # a clean-up while the agent runs
                for i in range(10):
                    await agent.prompt(f"after {i}")  # the agent serves on
                nursery.cancel_scope.cancel()
        after = await agent.state()
    assert any(e.kind == "journal_lost" for e in events)
    assert after.compactions > before.compactions and after.journal_id != before.journal_id
    records = await OffloadStore(offload).records(AGENT)
    assert records and min(r.seq for r in records) > before.journal_seq  # no number is reused
    first_line = orjson.loads((offload / f"{AGENT}.jsonl").read_bytes().split(b"\n")[0])
    assert first_line["follows"] == before.journal_id and first_line["seq"] == before.journal_seq
    await check_once(OffloadStore(offload), AGENT, [r.message for r in records])


async def test_a_truncated_journal_is_detected_and_numbers_go_on(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    first = await store.append(AGENT, [Message.user(f"m{i}") for i in range(5)])
    ref = JournalRef(first.journal, first.last_seq)
    path = tmp_path / f"{AGENT}.jsonl"
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:3]) + b"\n")  # records 3-5 and the commit are gone
    fresh = OffloadStore(tmp_path)
    with pytest.raises(JournalLost) as info:
        await fresh.append(AGENT, [Message.user("later")], expect=ref)
    assert info.value.why.startswith("truncated")
    r = await fresh.append(AGENT, [Message.user("later")], expect=ref)
    assert r.first_seq == 6  # numbers 3-5 are never given to other messages
    assert [x.seq for x in await fresh.records(AGENT)] == [6]  # 1-2 were never committed
    replaced = OffloadStore(tmp_path / "other")
    await replaced.append(AGENT, [Message.user("someone else's")])
    shutil.copy(tmp_path / "other" / f"{AGENT}.jsonl", path)  # another journal put in its place
    ref = JournalRef(r.journal, r.last_seq)
    with pytest.raises(JournalLost, match="replaced"):
        await OffloadStore(tmp_path).append(AGENT, [Message.user("x")], expect=ref)


async def test_a_restarted_writer_remembers_the_latest_attempt_of_a_message(tmp_path: Path) -> None:
    """Found by the crash test (a message read at 26, its append said 35): a message written by
    two attempts nobody committed (compactions 3 and 4), then retried by a new process. The
    writer remembered the older record (compaction 3, not reusable), so it wrote the message
    again, while reusing the other records of the compaction-4 attempt; committing that attempt
    showed the message at its old number, not the one the append reported."""
    x, ce, cf, y1, y2, z = (Message.user(t) for t in ("x", "ce", "cf", "y1", "y2", "z"))
    store = OffloadStore(tmp_path)
    await store.append(AGENT, [x, ce, cf], compaction=3, commit=False)
    second = await store.append(AGENT, [ce, cf, y1, y2], compaction=4, commit=False)
    assert second.written == 4  # the compaction-3 records are not reused by compaction 4
    retry = await OffloadStore(tmp_path).append(AGENT, [ce, cf, y1, y2, z], compaction=4)  # a new process
    visible = {r.message.id: r.seq for r in await OffloadStore(tmp_path).records(AGENT)}
    assert [visible[m.id] for m in (ce, cf, y1, y2, z)] == list(retry.seqs)
    assert retry.seqs[:4] == second.seqs and retry.written == 1  # the compaction-4 attempt, reused whole


@pytest.mark.parametrize("restart", [False, True])
async def test_an_attempt_whose_message_was_written_again_is_never_committed(tmp_path: Path, restart: bool) -> None:
    """Found by the crash test (a message read at 167, its append said 173): attempt A wrote
    m0-m4; a retry of the same compaction held m0-m2 but not m3-m4, so A was partial and the
    retry B wrote m0-m2 again. A third append holding all of them reused B's records for m0-m2
    and A's for m3-m4, so its commit committed A too, and readers showed m0-m2 at A's older
    numbers. Now A is superseded as soon as B writes one of its messages again (or, for a new
    process, as soon as it reads both records back): its records are never reused."""
    m = [Message.user(f"m{i}") for i in range(5)]
    n, p = Message.user("n"), Message.user("p")
    store = OffloadStore(tmp_path)
    await store.append(AGENT, m, compaction=14, commit=False)
    again = await store.append(AGENT, [*m[:3], n], compaction=14, commit=False)
    writer = OffloadStore(tmp_path) if restart else store
    last = await writer.append(AGENT, [*m, n, p], compaction=14)
    visible = {r.message.id: r.seq for r in await OffloadStore(tmp_path).records(AGENT)}
    assert [visible[x.id] for x in (*m, n, p)] == list(last.seqs)
    assert last.seqs[:3] == again.seqs[:3] and last.written == 3  # m3, m4 written again, and p
    assert (await OffloadStore(tmp_path).verify(AGENT)).uncommitted == 5  # A's records, never shown


async def test_a_chain_of_recorded_losses_is_followed_after_a_restart(tmp_path: Path) -> None:
    """j1 vanished (j2 follows it), then j2 was found truncated (j3 follows j2): a restarted
    writer whose state still names j1 goes on in j3 without reporting a loss again."""
    store = OffloadStore(tmp_path)
    first = await store.append(AGENT, [Message.user("one")])
    j1 = JournalRef(first.journal, first.last_seq)
    (tmp_path / f"{AGENT}.jsonl").unlink()
    with pytest.raises(JournalLost):
        await store.append(AGENT, [Message.user("two")], expect=j1)
    second = await store.append(AGENT, [Message.user("two")], expect=j1)
    with pytest.raises(JournalLost, match="truncated"):
        await store.append(AGENT, [Message.user("three")], expect=JournalRef(second.journal, 50))
    third = await store.append(AGENT, [Message.user("three")], expect=JournalRef(second.journal, 50))
    assert len({first.journal, second.journal, third.journal}) == 3 and third.seqs == (51,)
    restarted = OffloadStore(tmp_path)
    later = await restarted.append(AGENT, [Message.user("four")], expect=j1)
    assert later.journal == third.journal and later.seqs == (52,)
    heads = [ln for ln in (tmp_path / f"{AGENT}.jsonl").read_bytes().split(b"\n") if ln.startswith(b'{"journal"')]
    assert len(heads) == 2  # j2 and j3: no third loss recorded
    # a journal id the file never held is not taken for a successor
    with pytest.raises(JournalLost, match="replaced"):
        await OffloadStore(tmp_path).append(AGENT, [Message.user("five")], expect=JournalRef("j0123456789abcdef", 1))


@pytest.mark.parametrize("chunk", [1, 7, 40, 64 * 1024])
def test_find_head_across_chunk_boundaries(tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search for a journal's link line finds it wherever the reads cut the file, at its
    start too, and not inside a record that merely mentions it."""
    import cmdc.offload as offload
    import cmdc.store.file.scan as scan

    monkeypatch.setattr(scan, "_CHUNK", chunk)
    a, b = "j" + "a" * 16, "j" + "b" * 16
    decoy = Message.user(f'{{"journal":"{b}","follows":null}}', metadata={"journal": b})
    lines = [
        offload._link(a, None, AGENT, 0),
        b"".join(offload._record_pieces(1, 1, 0.0, [decoy], "k" + "1" * 16, a)),
        offload._link(b, a, AGENT, 1),
        b"".join(offload._record_pieces(2, 1, 0.0, [Message.user("x")], "k" + "2" * 16, b)),
    ]
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(lines))
    fd = os.open(path, os.O_RDONLY)
    try:
        size = path.stat().st_size
        head_a, head_b = offload._find_head(fd, size, a), offload._find_head(fd, size, b)
        assert head_a is not None and head_a.follows is None
        assert head_b is not None and head_b.follows == a
        assert offload._find_head(fd, size, "j" + "c" * 16) is None
        assert offload._find_head(fd, len(lines[0]) + len(lines[1]), b) is None  # only before `end`
    finally:
        os.close(fd)


async def test_chdir_by_a_tool_does_not_split_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(home)

    @tool
    async def wander(path: str) -> str:
        """Change directory."""
        os.chdir(elsewhere)
        return "moved " + "w" * 3000

    class Wanderer(Model):
        async def complete(self, request: ModelRequest) -> Message:
            reply = await super().complete(request)
            if reply.tool_calls:
                return Message.assistant(
                    "", tool_calls=(ToolCall(id=reply.tool_calls[0].id, name="wander", arguments={"path": "x"}),)
                )
            return reply

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            AGENT, Wanderer(), tools=[wander], summarizer=ExtractiveSummarizer(), config=agent_config("rel/offload")
        )
        for i in range(10):
            await agent.prompt(f"task {i}")
        state = await agent.state()
    assert state.compactions >= 2
    assert not (elsewhere / "rel").exists()
    records = await OffloadStore(home / "rel" / "offload").records(AGENT)
    assert len({r.compaction for r in records}) == state.compactions


# -- damage -------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["first", "middle", "last"])
async def test_a_flipped_byte_in_a_record(tmp_path: Path, where: str) -> None:
    offload = tmp_path / "offload"
    checkpoints = tmp_path / "ckpt"
    async with open_runtime(checkpoint_dir=checkpoints, log_events=False) as rt:
        agent = await rt.spawn(
            AGENT, Model(), tools=[read_file], summarizer=ExtractiveSummarizer(), config=agent_config(offload)
        )
        for i in range(8):
            await agent.prompt(f"task {i}")
    path = offload / f"{AGENT}.jsonl"
    data = bytearray(path.read_bytes())
    lines = data.split(b"\n")[:-1]
    numbered = [i for i, line in enumerate(lines) if line.startswith(b'{"message":')]
    target = {"first": numbered[0], "middle": numbered[len(numbered) // 2], "last": len(lines) - 1}[where]
    offset = sum(len(line) + 1 for line in lines[:target]) + 30
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))
    before = await OffloadStore(offload).records(AGENT)  # the damaged record is skipped, the rest read
    assert len(before) >= len(numbered) - 1 - (where == "last") * 100
    report = await OffloadStore(offload).verify(AGENT)
    assert [d.line for d in report.damaged] == [target + 1]
    # The agent resumes and goes on compacting: the writer moves a damaged tail aside first.
    async with open_runtime(checkpoint_dir=checkpoints, log_events=False) as rt:
        agent = await rt.spawn(
            AGENT,
            Model(),
            tools=[read_file],
            summarizer=ExtractiveSummarizer(),
            config=agent_config(offload),
            resume=True,
        )
        start = (await agent.state()).compactions
        for i in range(8):
            await agent.prompt(f"again {i}")
        assert (await agent.state()).compactions > start
    after = await OffloadStore(offload).records(AGENT)
    assert {r.message.id for r in before} <= {r.message.id for r in after}
    # The repair keeps every valid line and moves the damaged bytes aside.
    store = OffloadStore(offload)
    repaired = await store.repair(AGENT)
    assert await store.records(AGENT) == after
    assert (await store.verify(AGENT)).clean
    if repaired.damaged:
        assert repaired.side_file is not None and repaired.side_file.stat().st_size > repaired.moved > 0


def test_history_verify_and_repair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = OffloadStore(tmp_path)
    trio.run(store.append, AGENT, [Message.user(f"message {i}") for i in range(6)])
    path = tmp_path / f"{AGENT}.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"message 2", b"massage 2")
    path.write_bytes(b"\n".join(lines) + b'{"torn')
    assert main(["history", str(tmp_path), AGENT, "--verify"]) == 1
    out = capsys.readouterr().out
    assert "damaged: line 4" in out and "torn: 6 bytes" in out and "5 records" in out
    assert main(["history", str(tmp_path), AGENT, "--repair"]) == 0
    assert "every valid line kept" in capsys.readouterr().out
    assert main(["history", str(tmp_path), AGENT, "--verify"]) == 0
    assert "clean" in capsys.readouterr().out
    side = (tmp_path / f"{AGENT}.jsonl.damaged").read_bytes()
    assert b"massage 2" in side and b'{"torn' in side
    assert stat.S_IMODE((tmp_path / f"{AGENT}.jsonl").stat().st_mode) == 0o600


# -- safe files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_planted_links_at_temp_names_are_never_followed(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    chat = chat_file(tmp_path / "chat.jsonl")
    os.chmod(chat, 0o400)
    out = tmp_path / "chat.compacted.jsonl"
    names = iter(["0123456789abcdef"] + [os.urandom(8).hex() for _ in range(50)])
    monkeypatch.setattr(fs_module.secrets, "token_hex", lambda n=8: next(names))
    planted = tmp_path / f".{out.name}.0123456789abcdef.tmp"
    if kind == "symlink":
        planted.symlink_to(victim)
    else:
        os.link(victim, planted)
    assert main(["compact", str(chat), "--keep", "4", "--out", str(out)]) == 0
    assert victim.read_text() == "precious"
    assert stat.S_IMODE(out.stat().st_mode) == 0o400  # the input's stricter mode
    assert b"question 11" in out.read_bytes()


async def test_the_transcript_never_writes_through_a_hard_link(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append(AGENT, [Message.user("first")])
    md = await store.write_transcript(AGENT)
    victim = tmp_path / "victim.md"
    victim.write_text("precious")
    md.unlink()
    os.link(victim, md)  # planted where the next (appending) write goes
    await store.append(AGENT, [Message.user("second")])
    await store.write_transcript(AGENT)
    assert victim.read_text() == "precious"
    text = md.read_text()
    assert "first" in text and "second" in text and md.stat().st_nlink == 1
    assert stat.S_IMODE(md.stat().st_mode) == 0o600


async def test_temporary_children_leave_no_checkpoint(tmp_path: Path) -> None:
    class Delegator(Model):
        async def complete(self, request: ModelRequest) -> Message:
            self.calls += 1
            last = request.messages[-1]
            delegates = any(t.name == "delegate" for t in request.tools)
            if last.role == "user" and "child" not in last.text and delegates:
                call = ToolCall(id=f"d{self.calls}", name="delegate", arguments={"task": "child task"})
                return Message.assistant("", tool_calls=(call,))
            return Message.assistant("done")

    async with open_runtime(checkpoint_dir=tmp_path / "ckpt", log_events=False) as rt:
        agent = await rt.spawn("lead", Delegator(), delegation=True, config=agent_config(tmp_path / "offload"))
        for i in range(5):
            await agent.prompt(f"task {i}")
    left = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert left == ["lead.state.json"], left


# -- faults between an attempt and its commit ----------------------------------------------------


async def test_a_failed_commit_line_is_recovered_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offload, checkpoints = tmp_path / "offload", tmp_path / "ckpt"
    real = OffloadStore._commit_sync

    def broken(*args: Any) -> bool:
        raise OffloadError("the disk failed under the commit line")

    async with open_runtime(checkpoint_dir=checkpoints, log_events=False) as rt:
        agent = await rt.spawn(
            AGENT, Model(), tools=[read_file], summarizer=ExtractiveSummarizer(), config=agent_config(offload)
        )
        monkeypatch.setattr(OffloadStore, "_commit_sync", broken)
        for i in range(6):
            await agent.prompt(f"task {i}")  # compactions happen; their commits fail; turns go on
        state = await agent.state()
        assert state.compactions >= 1
        assert await OffloadStore(offload).read(AGENT) == []  # committed state, uncommitted journal
    monkeypatch.setattr(OffloadStore, "_commit_sync", real)
    async with open_runtime(checkpoint_dir=checkpoints, log_events=False) as rt:
        agent = await rt.spawn(
            AGENT,
            Model(),
            tools=[read_file],
            summarizer=ExtractiveSummarizer(),
            config=agent_config(offload),
            resume=True,
        )
        loaded = await agent.state()
        assert loaded == state
        # Resumed: its attempts are committed (the summary names them), each message once.
        records = await OffloadStore(offload).records(AGENT)
        assert len(records) == len({r.message.id for r in records}) > 0
        summary = next(m for m in loaded.messages if m.is_summary)
        first, last = summary.metadata["cmdc.first_seq"], summary.metadata["cmdc.last_seq"]
        assert any(first <= r.seq <= last for r in records)
        await agent.prompt("carry on")


async def test_checkpoint_store_is_absolute_and_temp_names_unpredictable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore("ckpt")
    assert store.root == tmp_path / "ckpt"
    first = {fs_module.temp_name(tmp_path / "x") for _ in range(100)}
    assert len(first) == 100

"""One conformance suite for every store: the file store and the PostgreSQL store.

The PostgreSQL cases need a server (see tests/conftest.py); the file cases always run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import trio.testing

from cmdc import Compacted, Compactor, ConfigError, Message, OffloadStore, State, ToolCall, open_runtime
from cmdc.errors import CheckpointError, InvalidMessage, JournalLost, OffloadError
from cmdc.offload import JournalRef, new_attempt_id
from cmdc.providers import ModelRequest, ScriptedProvider
from cmdc.store import FileStore, Store, open_store

BAD_IDS = ["", ".hidden", "a/b", "../x", "a\x00b", "x" * 129, "-lead"]


def batch(n: int, tag: str = "m") -> list[Message]:
    return [Message.user(f"{tag} number {i} about topic{i % 3}") for i in range(n)]


async def test_append_then_read_back_in_order(store: Store) -> None:
    first = batch(5, "alpha")
    r1 = await store.append("a1", first, compaction=1)
    assert (r1.first_seq, r1.last_seq, r1.written) == (1, 5, 5)
    second = [Message.assistant("beta reply", tool_calls=(ToolCall(id="c1", name="grep", arguments={"q": "x"}),))]
    r2 = await store.append("a1", second, compaction=2)
    assert (r2.first_seq, r2.last_seq) == (6, 6)
    records = await store.records("a1")
    assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r.message for r in records] == [*first, *second]
    assert [r.compaction for r in records] == [1] * 5 + [2]
    assert await store.read("a1") == [*first, *second]
    assert [r.seq for r in await store.read_range("a1", 2, 4)] == [2, 3, 4]
    assert await store.read_range("a1", 7, 100) == []
    assert await store.records("nobody") == []


async def test_a_batch_of_new_messages_is_numbered_in_its_order(store: Store) -> None:
    """The contract the ledger reads records by: a batch whose every message is new
    (`written == len(batch)`) is numbered `first_seq, first_seq + 1, ...` in the batch's order."""
    await store.append("a1", batch(3, "before"), compaction=1)
    fresh = batch(40, "fresh")
    result = await store.append("a1", fresh, compaction=2, commit=False)
    assert result.written == len(fresh) == len(result.seqs)
    assert result.seqs == tuple(range(result.first_seq, result.first_seq + len(fresh))) and result.first_seq == 4
    await store.commit("a1", [result.attempt or ""])
    records = {r.message.id: r.seq for r in await store.records("a1")}
    assert [records[m.id] for m in fresh] == list(result.seqs)


async def test_exactly_once_and_stable_numbers_across_retries(store: Store) -> None:
    msgs = batch(6)
    await store.append("a1", msgs[:4], compaction=1)
    again = await store.append("a1", msgs[:4], compaction=1)  # a retried batch
    assert again.written == 0 and (again.first_seq, again.last_seq) == (1, 4)
    grown = await store.append("a1", msgs, compaction=1)  # retried and grown
    assert grown.written == 2 and (grown.first_seq, grown.last_seq) == (1, 6)
    within = await store.append("a1", [msgs[0], msgs[0]], compaction=2)  # repeated within a batch
    assert within.written == 0
    records = await store.records("a1")
    assert [r.message.id for r in records] == [m.id for m in msgs]
    assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]
    new = await store.append("a1", [Message.user("later")], compaction=3)
    assert new.first_seq == 7  # numbers only grow
    assert await store.commit("a1", []) is False  # nothing to commit
    # a batch whose first and last messages are new, with journaled ones between them
    more = batch(3, "more")
    await store.append("a1", [more[1]], compaction=4)
    mixed = await store.append("a1", [more[0], msgs[2], more[1], msgs[5], more[2]], compaction=4)
    assert mixed.written == 2 and (mixed.first_seq, mixed.last_seq) == (3, 10)
    records = await store.records("a1")
    assert [r.seq for r in records] == list(range(1, 11))
    assert [r.message.text for r in records][6:] == ["later", more[1].text, more[0].text, more[2].text]
    assert mixed.seqs == (9, 3, 8, 6, 10)


async def test_agents_are_separate(store: Store) -> None:
    await store.append("a1", batch(2, "one"), compaction=1)
    await store.append("a2", batch(3, "two"), compaction=1)
    assert len(await store.records("a1")) == 2 and len(await store.records("a2")) == 3
    assert (await store.records("a2"))[0].seq == 1
    assert await store.search("a1", "two") == []


async def test_search_finds_words_best_first(store: Store) -> None:
    msgs = [
        Message.user("the deployment failed on the staging cluster"),
        Message.assistant("retrying the deployment"),
        Message.user("unrelated chatter"),
        Message.assistant("", tool_calls=(ToolCall(id="c9", name="kubectl", arguments={"cmd": "rollout"}),)),
    ]
    await store.append("a1", msgs, compaction=1)
    hits = await store.search("a1", "deployment staging")
    assert [h.message.id for h in hits][:2] == [msgs[0].id, msgs[1].id]
    assert {h.message.id for h in hits} == {msgs[0].id, msgs[1].id}
    # BM25: of two records holding the word once, the shorter ranks first (on both stores)
    assert [h.message.id for h in await store.search("a1", "DEPLOYMENT", limit=1)] == [msgs[1].id]
    assert [h.message.id for h in await store.search("a1", "kubectl")] == [msgs[3].id]
    assert [h.message.id for h in await store.search("a1", "rollout")] == [msgs[3].id]
    assert await store.search("a1", "nothing-here-zz") == []
    assert await store.search("a1", "  !!! ") == []
    # hostile queries are just words
    for query in ["' OR 1=1 --", "a & b | !c", "x:*", "\\", "'; DROP TABLE cmdc_records; --", "\x00"]:
        assert isinstance(await store.search("a1", query), list)
    assert len(await store.records("a1")) == 4
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError):
            await store.search("a1", "deployment", limit=bad)  # type: ignore[arg-type]


async def test_verify_and_transcript(store: Store) -> None:
    await store.append("a1", batch(3), compaction=1)
    await store.append("a1", batch(2, "next"), compaction=2)
    report = await store.verify("a1")
    assert report.clean and report.records == 5 and report.compactions == 2
    text = await store.transcript("a1")
    assert "## Compaction 1" in text and "## Compaction 2" in text and "next number 1" in text


async def test_a_lost_journal_raises_journal_lost_then_goes_on_without_reusing_numbers(store: Store) -> None:
    first = await store.append("a1", batch(3), compaction=1)
    assert first.journal is not None and first.last_seq == 3
    ok = await store.append("a1", batch(1, "fine"), compaction=2, expect=JournalRef(first.journal, 3))
    assert ok.first_seq == 4
    # a state naming another journal: replaced (recorded durably; the retry goes on)
    foreign = JournalRef("jdeadbeefdeadbeef", 4)
    with pytest.raises(JournalLost) as info:
        await store.append("a1", batch(2, "x"), compaction=3, expect=foreign)
    assert info.value.why.startswith("replaced") and info.value.expected == "jdeadbeefdeadbeef"
    assert len(await store.records("a1")) == 4  # nothing was written
    retry = await store.append("a1", batch(2, "x"), compaction=3, expect=foreign)
    assert retry.first_seq == 5 and retry.journal not in (None, first.journal, "jdeadbeefdeadbeef")
    # a state naming more records than the journal holds: truncated; numbers go on past it
    with pytest.raises(JournalLost) as info:
        await store.append("a2", batch(1, "y"), compaction=1, expect=JournalRef("jfeedfacefeedface", 40))
    assert info.value.why == "vanished"
    again = await store.append("a2", batch(1, "y"), compaction=1, expect=JournalRef("jfeedfacefeedface", 40))
    assert again.first_seq == 41
    with pytest.raises(JournalLost) as info:
        await store.append("a2", batch(1, "z"), compaction=2, expect=JournalRef(again.journal, 99))
    assert info.value.why.startswith("truncated")
    later = await store.append("a2", batch(1, "z"), compaction=2, expect=JournalRef(again.journal, 99))
    assert later.first_seq == 100
    assert [r.seq for r in await store.records("a2")] == [41, 100]
    # a commit checks it too
    pending = await store.append("a3", batch(2), compaction=1, attempt=new_attempt_id(), commit=False)
    with pytest.raises(JournalLost):
        await store.commit("a3", pending.pending, expect=JournalRef("jdeadbeefdeadbeef", 2))
    assert await store.records("a3") == []
    # a state that names no journal yet expects nothing
    assert (await store.append("a4", batch(1), expect=JournalRef(None, 0))).first_seq == 1


async def reopened(store: Store) -> Store:
    """The same store as a new process opens it: nothing remembered in memory."""
    if isinstance(store, FileStore):
        fresh = FileStore(store.root)
        fresh.journal = OffloadStore(store.root)  # not the process's shared one
        return fresh
    again = open_store(store.url)  # type: ignore[attr-defined]
    await again.start()
    return again


async def test_a_recorded_loss_is_not_reported_again_after_a_restart(store: Store) -> None:
    """A state naming a lost journal whose loss was recorded (its successor follows it) goes on
    in the successor, in this process and after a restart, however many records follow the
    link; a committed message appended again keeps its number."""
    first = await store.append("a1", batch(2), compaction=1)
    lost = JournalRef("jdeadbeefdeadbeef", 2)
    xs = batch(2, "x")
    with pytest.raises(JournalLost):
        await store.append("a1", xs, compaction=2, expect=lost)
    retry = await store.append("a1", xs, compaction=2, expect=lost, commit=False)
    assert retry.journal not in (None, first.journal, lost.journal) and retry.seqs == (3, 4)
    # a large committed batch after the link: a restarted writer reads only the end of a file
    big = [Message.user(f"bulk {i} " + "b" * 2_000) for i in range(800)]
    await store.append("a1", big, compaction=2, expect=lost)
    again = await reopened(store)
    try:
        # the state still names the lost journal (its retry was never committed): no new loss
        assert await again.commit("a1", retry.pending, expect=lost) is True
        records = {r.message.id: r.seq for r in await again.records("a1")}
        assert [records.get(m.id) for m in xs] == [3, 4]
        same = await again.append("a1", [*xs, big[0]], compaction=3, expect=lost)
        assert same.written == 0 and same.seqs == (3, 4, 5)
        later = await again.append("a1", batch(1, "y"), compaction=3, expect=JournalRef(retry.journal, 804))
        assert later.written == 1 and later.seqs == (805,) and later.journal == retry.journal
    finally:
        if again is not store:
            await again.aclose()
    ids = [r.message.id for r in await store.records("a1")]
    assert len(ids) == len(set(ids)) == 2 + 2 + 800 + 1


async def test_a_state_naming_a_journal_two_losses_back_goes_on_in_the_newest(store: Store) -> None:
    """Journal 1 found truncated (journal 2 follows it), then journal 2 (journal 3 follows it): a
    state still naming journal 1 appends and commits in journal 3 without a new loss, in this
    process and after a restart; its records keep their numbers and numbers only grow."""
    first = await store.append("a1", batch(2), compaction=1)
    j1 = JournalRef(first.journal, 10)  # names records the journal never held
    xs, ys = batch(2, "x"), batch(2, "y")
    with pytest.raises(JournalLost, match="truncated"):
        await store.append("a1", xs, compaction=2, expect=j1)
    second = await store.append("a1", xs, compaction=2, expect=j1)
    j2 = JournalRef(second.journal, 50)
    with pytest.raises(JournalLost, match="truncated"):
        await store.append("a1", ys, compaction=3, expect=j2)
    third = await store.append("a1", ys, compaction=3, expect=j2)
    assert (second.seqs, third.seqs) == ((11, 12), (51, 52))
    assert len({first.journal, second.journal, third.journal}) == 3
    same = await store.append("a1", [*xs, *batch(1, "z")], compaction=4, expect=j1)
    assert same.journal == third.journal and same.seqs == (11, 12, 53) and same.written == 1
    pending = await store.append("a1", batch(1, "p"), compaction=5, attempt=new_attempt_id(), commit=False, expect=j1)
    again = await reopened(store)
    try:
        assert await again.commit("a1", pending.pending, expect=JournalRef(first.journal, 2)) is True
        later = await again.append("a1", [*ys, *batch(1, "w")], compaction=6, expect=j1)
        assert later.journal == third.journal and later.seqs == (51, 52, 55) and later.written == 1
        with pytest.raises(JournalLost, match="replaced"):  # a journal the agent never had is no ancestor
            await again.append("a1", batch(1, "v"), compaction=7, expect=JournalRef("j0123456789abcdef", 1))
    finally:
        if again is not store:
            await again.aclose()
    assert [r.seq for r in await store.records("a1")] == [1, 2, 11, 12, 51, 52, 53, 54, 55]


async def test_the_compactor_checks_the_journal_with_every_store(store: Store) -> None:
    state = State(agent_id="c1", config={"compact_keep": ("messages", 2)})
    state = state.append(*[Message.user(f"message {i} " + "w" * 400) for i in range(12)])
    compactor = Compactor(store=store)
    done = await compactor.force_compact(state)
    assert isinstance(done, Compacted) and done.state.journal_id is not None
    grown = done.state.append(*[Message.user(f"later {i} " + "w" * 400) for i in range(8)])
    elsewhere = grown.evolve(journal_id="jdeadbeefdeadbeef")  # the state names a journal the store lost
    with pytest.raises(JournalLost):
        await compactor.force_compact(elsewhere)
    retried = await compactor.force_compact(elsewhere)  # the retry writes its whole batch
    assert isinstance(retried, Compacted)
    assert retried.report.first_seq > done.state.journal_seq  # no record number reused
    ids = [m.id for m in await store.read("c1")]
    assert len(ids) == len(set(ids)) == done.report.evicted + retried.report.evicted


def damage_one_record(store: Store, agent: str, seq: int) -> None:
    """Corrupt record `seq` of the agent's journal behind the store's back."""
    if isinstance(store, FileStore):
        path = store.journal.path_for(agent)
        lines = path.read_bytes().split(b"\n")
        for i, line in enumerate(lines):
            if f'"seq":{seq},'.encode() in line:
                lines[i] = line.replace(b"number", b"NUMBER")  # the checksum no longer matches
        path.write_bytes(b"\n".join(lines))
        return
    import psycopg

    with psycopg.connect(store.url, autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute("UPDATE cmdc_records SET crc = crc # 1 WHERE agent_id = %s AND seq = %s", (agent, seq))


async def test_repair_moves_damaged_records_aside_and_keeps_the_rest(store: Store) -> None:
    msgs = batch(5)
    await store.append("a1", msgs, compaction=1)
    damage_one_record(store, "a1", 3)
    report = await store.verify("a1")
    assert not report.clean and len(report.damaged) == 1 and report.records == 4
    assert [r.seq for r in await store.records("a1")] == [1, 2, 4, 5]  # readers skip it
    repaired = await store.repair("a1")  # type: ignore[attr-defined]
    assert not repaired.clean and repaired.moved > 0  # the report is of the journal before
    after = await store.verify("a1")
    assert after.clean and after.records == 4
    assert [r.message for r in await store.records("a1")] == [msgs[i] for i in (0, 1, 3, 4)]
    assert (await store.repair("a1")).moved == 0  # type: ignore[attr-defined]
    assert (await store.append("a1", [Message.user("later")], compaction=2)).first_seq == 6  # never reused
    assert (await store.repair("nobody")).records == 0  # type: ignore[attr-defined]


async def test_checkpoints_save_load_delete_list(store: Store) -> None:
    cps = store.checkpoints
    assert await cps.load("a1") is None and await cps.agents() == []
    state = State(agent_id="a1", config={"compact_keep": ("messages", 4)}).append(*batch(3))
    await cps.save(state)
    assert await cps.load("a1") == state
    newer = state.append(Message.assistant("more"))
    await cps.save(newer)
    assert await cps.load("a1") == newer
    await cps.save(State(agent_id="b2"))
    assert await cps.agents() == ["a1", "b2"]
    await cps.delete("a1")
    await cps.delete("a1")  # missing is fine
    assert await cps.load("a1") is None and await cps.agents() == ["b2"]
    with pytest.raises(TypeError):
        await cps.save("not a state")  # type: ignore[arg-type]


async def test_agents_lists_journals_and_checkpoints_and_written_at_says_when(store: Store) -> None:
    assert await store.agents() == []
    await store.append("j1", batch(2), compaction=1)
    before = time.time()
    await store.checkpoints.save(State(agent_id="c1"))
    assert await store.agents() == ["c1", "j1"]
    saved, nobody = await store.written_at(["c1", "nobody"])
    assert nobody is None and saved is not None and before - 5 <= saved <= time.time() + 5
    await store.checkpoints.save(State(agent_id="c1").append(Message.user("later")))
    [again] = await store.written_at(["c1"])
    assert again is not None and again >= saved
    assert await store.written_at([]) == []
    [journal_only] = await store.written_at(["j1"])  # a journal and no checkpoint: its last write
    assert journal_only is not None and before - 5 <= journal_only <= time.time() + 5
    for bad in BAD_IDS:
        with pytest.raises(ConfigError):
            await store.written_at(["c1", bad])
    assert store.shared is (not isinstance(store, FileStore))  # a database is shared, a directory is not


def test_a_store_object_short_of_some_members_is_told_which(tmp_path: Path) -> None:
    """A store of the user's own that lacks members of the protocol gets a ConfigError naming
    them (not "store must be a directory...")."""
    from cmdc.store.open import _members

    class Mine:
        pass

    for name in _members():
        if name not in ("shared", "written_at"):
            setattr(Mine, name, lambda *a: None)
    with pytest.raises(ConfigError, match="is not a store: it has no shared, written_at"):
        open_store(Mine())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="store must be a directory"):
        open_store(object())  # type: ignore[arg-type]


async def test_unsafe_agent_ids_are_refused_before_anything(store: Store) -> None:
    for bad in BAD_IDS:
        with pytest.raises(ConfigError):
            await store.append(bad, batch(1), compaction=1)
        with pytest.raises(ConfigError):
            await store.records(bad)
        with pytest.raises(ConfigError):
            await store.search(bad, "x")
        with pytest.raises(ConfigError):
            await store.checkpoints.load(bad)
        with pytest.raises(ConfigError):
            await store.checkpoints.delete(bad)
    with pytest.raises((ConfigError, InvalidMessage)):
        await store.append("a1", ["not a message"], compaction=1)  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        await store.append("a1", batch(1), compaction=-1)
    assert await store.records("a1") == []


async def test_concurrent_writers_never_share_a_number(store: Store) -> None:
    async def write(tag: str) -> None:
        for k in range(5):
            await store.append("a1", batch(3, f"{tag}{k}"), compaction=k)

    async with trio.open_nursery() as nursery:
        for tag in "abcd":
            nursery.start_soon(write, tag)
    records = await store.records("a1")
    assert [r.seq for r in records] == list(range(1, 61))
    assert len({r.message.id for r in records}) == 60


async def test_unicode_and_large_messages(store: Store) -> None:
    big = Message.user("ünïcödé 🚀 " * 20_000)
    odd = Message.user("nul\x00byte and \\ backslash and 'quotes' \"dq\"")
    await store.append("a1", [big, odd], compaction=1)
    assert await store.read("a1") == [big, odd]
    assert [h.message.id for h in await store.search("a1", "backslash")] == [odd.id]


def test_open_store_chooses_by_spec(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path), FileStore)
    assert isinstance(open_store(str(tmp_path)), FileStore)
    file_store = FileStore(tmp_path)
    assert open_store(file_store) is file_store
    for bad in ["", "http://example.com/x", "a\x00b", 42, object()]:
        with pytest.raises(ConfigError):
            open_store(bad)  # type: ignore[arg-type]
    pg = open_store("postgresql://nobody@/nowhere?host=/nonexistent")
    assert type(pg).__name__ == "PostgresStore"
    assert open_store(pg) is pg


async def test_file_errors_are_typed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = FileStore(blocker)
    with pytest.raises(OffloadError):
        await store.append("a1", batch(1), compaction=1)
    with pytest.raises(CheckpointError):
        await store.checkpoints.save(State(agent_id="a1"))


def _answer(request: ModelRequest) -> str:
    if request.metadata.get("cmdc.purpose") == "summarize":
        return "summary: the user counted fruit"
    users = [m.text for m in request.messages if m.role == "user"]
    return f"noted {users[-1]}"


async def test_a_runtime_keeps_journals_and_checkpoints_in_its_store(store_spec: str) -> None:
    config = {"compact_trigger": ("messages", 8), "compact_keep": ("messages", 2)}
    model = ScriptedProvider([_answer], cycle=True)
    async with open_runtime(store=store_spec, max_resident=1, log_events=False) as rt:
        assert rt.store is not None
        a = await rt.spawn("a1", model, config=config, recall=True)
        b = await rt.spawn("b1", model, config=config)
        for i in range(8):
            await a.prompt(f"apple {i}")
        await b.prompt("banana")  # a1 is deactivated to make room: its state is in the store
        await trio.testing.wait_all_tasks_blocked()
        assert rt.resident == ["b1"]
        journal = await rt.store.records("a1")
        assert journal and all(r.message.role in ("user", "assistant") for r in journal)
        assert any(r.message.text == "apple 1" for r in journal)  # apple 0 is the pinned task
        saved = await rt.store.checkpoints.load("a1")
        assert saved is not None and saved.compactions >= 1
        assert (await a.prompt("apple 8")).text == "noted apple 8"  # activated from the store
        assert (await a.state()).compactions == saved.compactions or (await a.state()).compactions > 0
        recall = rt._agents["a1"].tools["recall"]
        found = await recall.run({"query": "apple 1"})
        assert "apple 1" in found
        assert sorted(await rt.store.checkpoints.agents()) == ["a1", "b1"]


async def test_a_store_object_is_used_as_is_and_not_closed(tmp_path: Path) -> None:
    mine = FileStore(tmp_path / "mine")
    async with open_runtime(store=mine, log_events=False) as rt:
        assert rt.store is mine and rt.checkpoints is mine.checkpoints
        await (await rt.spawn("x", ScriptedProvider(["hi"]))).prompt("hello")
    assert (tmp_path / "mine" / "x.state.json").exists()
    with pytest.raises(ConfigError, match="not both"):
        async with open_runtime(store=mine, checkpoint_dir=tmp_path):
            pass
    with pytest.raises(ConfigError):
        async with open_runtime(store="ftp://nowhere"):
            pass


async def test_clipped_reads_of_a_huge_record(store: Store) -> None:
    """`max_chars` (every store takes it): a huge message (read in short steps) and a
    small one come cut the same way, `clipped` counting the rest; read whole, the huge one is
    its text; recall shows its head and counts the rest."""
    from cmdc.recall import recall_tool

    line = "." * 990 + ' "q" \\ \t\n'
    # 2 MB: past cmdc._bigjson.BIG; the word is also at its head: PostgreSQL indexes a record's
    # first SEARCH_PREFIX_CHARS characters only (the file store reads it whole)
    big = "intro é 😀 needle77 " + line * 2_000 + " needle77 ü"
    small = "small needle77 " * 20
    await store.append("a1", [Message.user(small), Message.tool_result("c1", big), Message.user("after")])
    hits = await store.search("a1", "needle77", max_chars=100)  # type: ignore[call-arg]
    assert sorted((h.seq, h.message.text, h.clipped) for h in hits) == [
        (1, small[:100], len(small) - 100),
        (2, big[:100], len(big) - 100),
    ]
    records = await store.records("a1", max_chars=100)  # type: ignore[call-arg]
    assert [(r.message.id, r.clipped) for r in records] == [
        (m.id, c) for m, c in zip(await store.read("a1"), [len(small) - 100, len(big) - 100, 0], strict=True)
    ]
    assert [r.seq for r in await store.read_range("a1", 2, 3, max_chars=0)] == [2, 3]  # type: ignore[call-arg]
    (whole,) = [h for h in await store.search("a1", "needle77") if h.seq == 2]
    assert whole.clipped == 0 and whole.message.content == big
    assert (await store.records("a1"))[1].message == whole.message
    report = await store.verify("a1")
    assert report.clean and report.records == 3
    with pytest.raises(ConfigError, match="max_chars"):
        await store.records("a1", max_chars=-1)  # type: ignore[call-arg]
    out = await recall_tool(store, "a1").run({"first": 2, "last": 2})
    head, rest = out.split("[record 2 · compaction 0 · tool (call c1)]\n", 1)[1].split("\n[... ", 1)
    assert head.startswith("intro é 😀 needle77 ....") and big.startswith(head)
    assert rest.startswith(f"{len(big) - len(head)} more characters; the record is larger than the recall budget")

"""Recall does not stall the runtime: the longest scheduling stall while one agent recalls over
a large journal.

Run: python -m benchmarks.recall_stall [--records 5000] [--big-mb 0] [--store postgresql://...]

One agent (`recall=True`) searches its journal: `--records` records of ~1 KB of words, plus
one record of `--big-mb` MB. Its model asks for a search with a 4,000-character query (the
longest the tool takes); then the journal is searched directly with a 20,000-word query (the
issue's attack; the store reads its first 64 distinct words) and read, both with texts cut
as the recall tool asks (`max_chars`: a huge record's head is read and the rest counted, its
whole text never built). Meanwhile a probe task sleeps 2 ms at a time and records how late it
wakes (the scheduling stall every agent in the runtime would see), and a neighbour agent
answers pings. Printed: each phase's duration and longest stall (target: longest < 50 ms over
the recall phases), and the neighbour's pings. The reads of whole texts are shown too: a
caller asking for a 50 MB text gets one 50 MB string, built by one call. With `--big-mb`, then:
an agent given that text as a tool result (one turn), its compaction (the text journaled) and
its transcript, each with its stall (not part of the recall target).
"""

from __future__ import annotations

import argparse
import random
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

import cmdc
from cmdc import Message, OffloadStore, ToolCall, tool
from cmdc._search import query_words, rank_in_bites
from cmdc.providers import ScriptedProvider

TARGET_MS = 50.0
CUT = 2_000 * 4 + 1
"""The characters of a text the recall tool asks a store for (its budget, 2,000 tokens, x 4, + 1)."""
COLD = "first journal read, whole texts (store.records(), cold)"
RECALL = "recall tool, through the agent (4,000-character query)"
ATTACK = "store.search (20,000-word query, texts cut as recall reads them)"
CUT_READ = f"journal read, texts cut as recall reads them (store.records(max_chars={CUT}))"
READ = "journal read, whole texts (store.records(), in a worker)"
SCORE = "scoring those (cmdc._search, in 2 ms bites)"
RECALLING = (RECALL, ATTACK, CUT_READ)
"""The phases the target is about: what a recall does."""
WRITE_TURN = "an agent given the big text as a tool result (one turn)"
WRITE_COMPACT = "its compaction (the big result journaled)"
TRANSCRIPT = "the transcript of its journal (whole texts)"
WRITING = (WRITE_TURN, WRITE_COMPACT, TRANSCRIPT)
T = TypeVar("T")
TICK = 0.002
VOCABULARY = [f"word{i}" for i in range(5_000)]


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=n_words))


async def _fill(store: Any, agent: str, records: int, big_mb: int, rng: random.Random) -> tuple[int, str]:
    """Fill the journal; return its characters of text and the big record's text ("" if none)."""
    size = 0
    big = ""
    batch: list[Message] = []
    for i in range(records):
        batch.append(Message.user(f"record {i}: " + _text(rng, 140)))
        if len(batch) == 500:
            size += sum(len(m.text) for m in batch)
            await store.append(agent, batch)
            batch = []
    if batch:
        size += sum(len(m.text) for m in batch)
        await store.append(agent, batch)
    if big_mb:
        chunk = _text(rng, 20_000)
        big = (chunk + " ") * (big_mb * 1024 * 1024 // (len(chunk) + 1))
        size += len(big)
        await store.append(agent, [Message.tool_result("big", big)])
    return size, big


async def _write_phases(rt: Any, timed: Any, name: str, big: str, cfg: dict[str, Any], store: Any) -> None:
    """An agent whose tool returns `big`: the turn, a compaction that journals it, its transcript."""

    @tool
    async def fetch() -> str:
        """Fetch the big text."""
        return big

    call = ToolCall(id="f1", name="fetch", arguments={})
    model = ScriptedProvider([Message.assistant("", tool_calls=(call,)), "got it"], cycle=True)
    config = {**cfg, "context_window": 100_000_000, "compact_keep": ("messages", 1)}
    writer = await rt.spawn(name, model, tools=[fetch], config=config)
    await timed(WRITE_TURN, lambda: writer.prompt("fetch it"))
    await timed(WRITE_COMPACT, lambda: writer.compact())
    if isinstance(store, OffloadStore):
        await timed(TRANSCRIPT, lambda: store.write_transcript(name))
    else:
        await timed(TRANSCRIPT, lambda: store.transcript(name))


async def _measure(directory: Path, records_n: int, big_mb: int, seed: int, url: str | None) -> dict[str, Any]:
    rng = random.Random(seed)
    if url is None:
        store: Any = OffloadStore(directory)
        name = "reader"
        journal_chars, big = await _fill(store, name, records_n, big_mb, rng)
    else:  # PostgreSQL: filled below, through the runtime's store; a new agent name each run
        name = f"reader-{secrets.token_hex(4)}"
    tool_query = _text(rng, 10_000)[:4_000]
    attack_query = _text(rng, 20_000)
    call = ToolCall(id="r1", name="recall", arguments={"query": tool_query, "limit": 8})
    model = ScriptedProvider([Message.assistant("", tool_calls=(call,)), "found it"])
    stalls: dict[str, list[float]] = {}
    phase = ["idle"]
    pings: list[float] = []
    durations: dict[str, float] = {}
    done = trio.Event()

    async def probe() -> None:
        while not done.is_set():
            t0, during = trio.current_time(), phase[0]
            await trio.sleep(TICK)
            stalls.setdefault(during, []).append(max(0.0, trio.current_time() - t0 - TICK))

    async def neighbour_pings(ref: cmdc.AgentRef) -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await ref.ping()
            pings.append(time.perf_counter() - t0)
            await trio.sleep(0.005)

    async def timed(what: str, fn: Callable[[], Awaitable[T]]) -> T:
        phase[0] = what
        await trio.sleep(TICK * 2)  # a tick that started in the last phase ends first
        t0 = time.perf_counter()
        value = await fn()
        durations[what] = time.perf_counter() - t0
        phase[0] = "idle"
        return value

    async with cmdc.open_runtime(store=url) as rt:
        cfg = {"compact_offload_dir": str(directory)}
        if url is not None:
            store = rt.store
            journal_chars, big = await _fill(store, name, records_n, big_mb, rng)
        reader = await rt.spawn(name, model, config=cfg, recall=True)
        neighbour = await rt.spawn("neighbour", ScriptedProvider(["pong"], cycle=True), config=cfg)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            nursery.start_soon(neighbour_pings, neighbour)
            await trio.sleep(0.1)
            await timed(COLD, lambda: store.records(name))
            reply = await timed(RECALL, lambda: reader.prompt("find it"))
            hits = await timed(ATTACK, lambda: store.search(name, attack_query, limit=10, max_chars=CUT))
            await timed(CUT_READ, lambda: store.records(name, max_chars=CUT))
            records = await timed(READ, lambda: store.records(name))
            words = query_words(attack_query)
            await timed(SCORE, lambda: rank_in_bites(records, words, 10))
            if big_mb:
                await _write_phases(rt, timed, f"w{name}", big, cfg, store)
            await trio.sleep(0.1)
            done.set()
        (result,) = [m for m in (await reader.state()).messages if m.role == "tool"]
    return {
        "records": records_n + (1 if big_mb else 0),
        "journal_mb": journal_chars / 1e6,
        "durations": durations,
        "stalls": {k: (max(v), len(v)) for k, v in stalls.items()},
        "stall_max": max(max(stalls[p]) for p in RECALLING),
        "write_stall_max": max((max(stalls[p]) for p in WRITING if p in stalls), default=0.0),
        "pings": len(pings),
        "ping_max": max(pings) if pings else float("nan"),
        "answered": reply.text == "found it" and not result.is_error and bool(hits),
    }


def run(
    records: int = 5_000,
    big_mb: int = 50,
    seed: int = 1,
    out: Callable[[str], None] = print,
    store: str | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        f = trio.run(_measure, Path(tmp), records, big_mb, seed, store)
    out(
        f"journal ({'file store' if store is None else 'PostgreSQL store'}): "
        f"{f['records']:,} records, {f['journal_mb']:.1f} MB of text"
        + (f" (one record of {big_mb} MB)" if big_mb else "")
    )
    for what, seconds in f["durations"].items():
        worst, ticks = f["stalls"].get(what, (0.0, 0))
        out(f"{what}: {seconds * 1e3:,.0f} ms; longest stall {worst * 1e3:.1f} ms ({ticks:,} ticks)")
    idle, ticks = f["stalls"].get("idle", (0.0, 0))
    out(f"idle (the machine's own noise): longest stall {idle * 1e3:.1f} ms ({ticks:,} ticks)")
    verdict = "pass" if f["stall_max"] * 1e3 < TARGET_MS else "MISS"
    out(
        f"longest scheduling stall while an agent recalls: {f['stall_max'] * 1e3:.1f} ms "
        f"(target < {TARGET_MS:.0f} ms: {verdict})"
    )
    if big_mb:
        worst = f["write_stall_max"] * 1e3
        out(f"longest scheduling stall while an agent writes and compacts the big text: {worst:.1f} ms")
    out(f"neighbour: {f['pings']:,} pings answered, slowest {f['ping_max'] * 1e3:.1f} ms")
    out(f"recall answered: {f['answered']}")
    return f


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=5_000)
    parser.add_argument("--big-mb", type=int, default=0, help="add one record of this many MB")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: the file store, in a temp dir)")
    args = parser.parse_args(argv)
    run(args.records, args.big_mb, args.seed, store=args.store)


if __name__ == "__main__":
    main()

"""Issue 28's figures for the file store's index: python -m benchmarks.bench_search [--records N]

- search p50/p99 over one agent's journal of N records (default 1,000,000; two random words of
  the journal per query, as bench_store), the index built;
- the index built from scratch: records per second;
- `cmdc history DIR AGENT --limit 3` and `--range A B` on a journal of about 121 MB (in-process
  wall time of the command, the index built; and the first call, which builds it);
- recall of 3 records: journal bytes read (flat, whatever the size).

The journals are written once into a temp directory with the store's own batched append (no
index while writing) and reused by every measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_store import journal_messages, percentile
from cmdc import Compactor, Message, OffloadStore, State, _index
from cmdc.cli import main as cli_main
from cmdc.store import FileStore

HISTORY_MB = 121


async def _fill(root: Path, agent: str, records: int) -> list[str]:
    """Write `records` records (batches of 10,000); return words that are in the journal."""
    store = OffloadStore(root, index=False)
    seen: list[str] = []
    for batch in journal_messages(records):
        await store.append(agent, batch, compaction=1)
        seen += batch[0].text.split()
    return seen


async def _fill_mb(root: Path, agent: str, megabytes: int) -> int:
    """Write a journal of about `megabytes` MB of session-like records (1-2 kB each)."""
    store = OffloadStore(root, index=False)
    rnd = random.Random(5)
    n = 0
    while store.path_for(agent).exists() is False or store.path_for(agent).stat().st_size < megabytes * 1_000_000:
        batch = [
            Message.user(
                f"turn {n + i}: " + " ".join(f"w{rnd.randrange(50_000)}" for _ in range(rnd.randrange(150, 300)))
            )
            for i in range(1_000)
        ]
        await store.append(agent, batch, compaction=1 + n // 1_000)
        n += len(batch)
    return n


def _quiet_cli(argv: list[str], cpu: list[float] | None = None) -> float:
    out = io.StringIO()
    t, c = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out):
        code = cli_main(argv)
    took = time.perf_counter() - t
    if cpu is not None:
        cpu.append(time.process_time() - c)
    if code != 0:
        raise RuntimeError(f"cmdc {' '.join(argv)} exited {code}: {out.getvalue()[-300:]}")
    return took


BUILDS = 3  # builds of the index from scratch, timed (the median is reported)


async def _search_figures(root: Path, records: int, queries: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    seen = await _fill(root, "big", records)
    fill = time.perf_counter() - t0
    store = OffloadStore(root)
    journal = store.path_for("big")
    builds: list[tuple[float, float]] = []
    for _ in range(BUILDS):  # the median of a few: one build's rate varies by 10% on a shared machine
        _index.remove(journal)  # both files: the records' and the words'
        t1, c1 = time.perf_counter(), time.process_time()
        ext = await store.extent("big")  # builds the index from scratch (nothing else runs meanwhile)
        builds.append((time.perf_counter() - t1, time.process_time() - c1))
        assert ext.records == records, ext
    build, build_cpu = sorted(builds)[len(builds) // 2]
    rnd = random.Random(11)
    times, cpu = [], []
    for _ in range(queries):
        query = f"{rnd.choice(seen)} {rnd.choice(seen)}"
        c, t = time.process_time(), time.perf_counter()
        hits = await store.search("big", query, limit=10)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)  # every thread's: the search runs in a worker thread
        if not hits:
            raise RuntimeError(f"search for {query!r} found nothing")
    # `cmdc history --limit 3` on this journal: settled, then after it grew by 10 records (the
    # compactions are counted on from where the last count ended, not from the start)
    settled = await trio.to_thread.run_sync(_quiet_cli, ["history", str(root), "big", "--limit", "3"])
    await OffloadStore(root, index=False).append("big", [Message.user(f"grown {i}") for i in range(10)], compaction=2)
    grown = await trio.to_thread.run_sync(_quiet_cli, ["history", str(root), "big", "--limit", "3"])
    return {
        "big_limit_s": settled,
        "big_grown_limit_s": grown,
        "records": records,
        "journal_bytes": journal.stat().st_size,
        "index_bytes": _index.index_path(journal).stat().st_size + _index.words_path(journal).stat().st_size,
        "fill_s": fill,
        "build_s": build,
        "build_per_s": records / build,
        "build_range": (records / max(builds)[0], records / min(builds)[0]),
        "build_cpu_per_s": records / build_cpu,
        "p50": percentile(times, 0.5),
        "p99": percentile(times, 0.99),
        "cpu_p50": percentile(cpu, 0.5),
        "cpu_p99": percentile(cpu, 0.99),
        "load": os.getloadavg()[0],
        "queries": queries,
    }


async def _history_figures(root: Path, megabytes: int) -> dict[str, Any]:
    n = await _fill_mb(root, "h", megabytes)
    size = OffloadStore(root).path_for("h").stat().st_size
    first = await trio.to_thread.run_sync(_quiet_cli, ["history", str(root), "h", "--limit", "3"])
    cpu: list[float] = []
    limit = sorted(
        [await trio.to_thread.run_sync(_quiet_cli, ["history", str(root), "h", "--limit", "3"], cpu) for _ in range(5)]
    )
    mid = n // 2
    rng = sorted(
        [
            await trio.to_thread.run_sync(_quiet_cli, ["history", str(root), "h", "--range", str(mid), str(mid + 1)])
            for _ in range(5)
        ]
    )
    _index.READS.update(bytes=0, records=0)
    from cmdc.recall import recall_tool

    await recall_tool(OffloadStore(root), "h").run({"first": mid, "last": mid + 2})
    return {
        "history_records": n,
        "history_bytes": size,
        "history_first_s": first,
        "history_limit_s": limit[2],
        "history_limit_max_s": limit[-1],
        "history_limit_cpu_s": statistics.median(cpu),
        "history_range_s": rng[2],
        "recall_bytes_read": _index.READS["bytes"],
    }


async def _one_compaction(journal: OffloadStore, messages: list[Message], agent: str) -> float:
    state = State(agent_id=agent, messages=tuple(messages), config={"compact_keep": ("messages", 20)})
    store = FileStore(journal.root)
    store.journal = journal  # with or without its index
    compactor = Compactor(store=store)  # the offline extractive summarizer
    t = time.perf_counter()
    await compactor.force_compact(state)
    return time.perf_counter() - t


async def _compaction_figures(root: Path, messages: int, reps: int) -> dict[str, Any]:
    """One compaction of `messages` messages on a store without an index and on one with it
    (taking turns, so both see the same load), then the index brought up to date (the work the
    store's background thread does once the store is quiet): medians."""
    rnd = random.Random(3)
    msgs = [Message.user("task: w00001x")]
    for i in range(messages - 1):
        text = " ".join(f"w{rnd.randrange(20_000):05d}x" for _ in range(24))
        msgs.append(Message.user(text) if i % 2 else Message.assistant(text))
    off: list[float] = []
    on: list[float] = []
    catch: list[float] = []
    for rep in range(reps):
        for indexed in (False, True) if rep % 2 else (True, False):  # neither always goes first
            store = OffloadStore(root / f"{indexed}{rep}", index=indexed)
            gc.collect()  # the previous run's garbage is not this one's cost
            (on if indexed else off).append(await _one_compaction(store, msgs, "c1"))
            if indexed:
                t = time.perf_counter()
                await store.extent("c1")  # the index brought up to the journal's end
                catch.append(time.perf_counter() - t)
    med = statistics.median
    return {
        "compaction_messages": messages,
        "compaction_off_s": med(off),
        "compaction_on_s": med(on),
        "compaction_index_s": med(catch),
        "compaction_path": med(on) / med(off) - 1,
        "compaction_overhead": (med(on) + med(catch)) / med(off) - 1,
    }


def measure(
    records: int = 1_000_000, queries: int = 200, history_mb: int = HISTORY_MB, compaction_messages: int = 10_000
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = trio.run(_search_figures, Path(tmp) / "s", records, queries)
    with tempfile.TemporaryDirectory() as tmp:
        out.update(trio.run(_history_figures, Path(tmp) / "h", history_mb))
    with tempfile.TemporaryDirectory() as tmp:
        out.update(trio.run(_compaction_figures, Path(tmp), compaction_messages, 8))
    return out


def report(f: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"file store search over {f['records']:,} records ({f['journal_bytes'] / 1e6:,.0f} MB journal, "
            f"{f['index_bytes'] / 1e6:,.0f} MB index): p50 {f['p50'] * 1e3:.2f} ms, p99 {f['p99'] * 1e3:.2f} ms "
            f"({f['queries']} queries; target p99 < 20 ms); CPU time per query p50 {f['cpu_p50'] * 1e3:.2f} ms, "
            f"p99 {f['cpu_p99'] * 1e3:.2f} ms (load average {f['load']:.1f}: under load the wall time is the CPU "
            "time and the wait for a core)",
            f"index built from scratch (median of {BUILDS}): {f['build_s']:.1f} s, {f['build_per_s']:,.0f} records/s "
            f"(range {f['build_range'][0]:,.0f}-{f['build_range'][1]:,.0f}; {f['build_cpu_per_s']:,.0f} records per "
            "CPU second; target >= 100,000/s)",
            f"history on a {f['history_bytes'] / 1e6:,.0f} MB journal ({f['history_records']:,} records): "
            f"--limit 3 {f['history_limit_s'] * 1e3:.1f} ms (slowest of 5: {f['history_limit_max_s'] * 1e3:.1f} ms; "
            f"CPU {f['history_limit_cpu_s'] * 1e3:.1f} ms), --range {f['history_range_s'] * 1e3:.1f} ms "
            f"(target < 100 ms; the first call, building the index: {f['history_first_s']:.1f} s)",
            f"history --limit 3 on the {f['records']:,}-record journal: {f['big_limit_s'] * 1e3:.1f} ms; after it "
            f"grew by 10 records: {f['big_grown_limit_s'] * 1e3:.1f} ms",
            f"recall of 3 records from it: {f['recall_bytes_read']:,} journal bytes read",
            f"one compaction of {f['compaction_messages']:,} messages: {f['compaction_off_s'] * 1e3:,.0f} ms without "
            f"an index, {f['compaction_on_s'] * 1e3:,.0f} ms with it: {f['compaction_path']:+.0%} on its path (target "
            f"< 15%); then {f['compaction_index_s'] * 1e3:,.0f} ms indexing in the background once the store is "
            f"quiet ({f['compaction_index_s'] / f['compaction_off_s']:.0%} of the compaction's time): the index adds "
            f"{f['compaction_overhead']:+.0%} to the compaction's work in all",
            f"(load average {os.getloadavg()[0]:.1f} at the end)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--history-mb", type=int, default=HISTORY_MB, help="the journal cmdc history reads")
    parser.add_argument("--compaction", type=int, default=10_000, help="messages of the compaction timed")
    args = parser.parse_args(argv)
    print(report(measure(args.records, args.queries, args.history_mb, args.compaction)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

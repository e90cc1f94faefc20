"""Stores: the file store against the PostgreSQL store, and virtual agents.

Run: python -m benchmarks.bench_store [--records N] [--agents N] [--resident N] [--queries N]
                                      [--file-queries N] [--compaction N] [--compaction-reps N]
                                      [--concurrency N] [--json]
     python -m benchmarks.bench_store _virtual STORE AGENTS RESIDENT SAMPLE [CONCURRENCY]
       (one virtual-agents run on STORE, a directory or a postgresql:// URL: its JSON on
       stdout, its table on stderr)

- search latency over one agent's journal of N records (p50/p99 per store);
- one compaction of 10k messages with each store (the PostgreSQL one against the file one;
  the median of `--compaction-reps` runs, each on a fresh store, the stores taking turns);
- N named agents each prompted once (`--concurrency` at a time), with at most R resident
  (virtual agents): wall time, peak RSS, RSS as the agents grow (`rss_curve`), and the latency
  of activating a deactivated agent (p50/p99), per store. Each of these runs in a fresh
  subprocess, so its peak RSS is its own. `CMDC_BENCH_PROGRESS=1` prints progress to stderr.
  The default, 1,000,000 agents with 10,000 resident, takes long: measured on 2 shared cores,
  ~2-3 ms per agent, so 35-55 minutes per store (`--agents 20000` for a quick look).

It prints a table (the virtual-agents runs as one row per store); `--json` prints every figure
as JSON instead.

The PostgreSQL figures need a server: `CMDC_TEST_POSTGRES_URL` (`eval "$(scripts/pg_test.sh
start)"`); each run uses a fresh database. Without one they are reported as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import trio
import trio.testing

import cmdc
from cmdc import Compactor, Message, State
from cmdc.providers import ModelRequest
from cmdc.store import Store, open_store

VOCABULARY = 20_000
WORDS_PER_MESSAGE = 24
BATCH = 10_000


def postgres_base() -> str | None:
    return os.environ.get("CMDC_BENCH_POSTGRES_URL") or os.environ.get("CMDC_TEST_POSTGRES_URL") or None


@contextlib.contextmanager
def fresh_database(base: str) -> Iterator[str]:
    import psycopg

    name = f"cmdc_bench_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        parts = urllib.parse.urlsplit(base)
        yield urllib.parse.urlunsplit(parts._replace(path="/" + name))
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_mode(base: str) -> dict[str, str]:
    """How durable the server's commits are: with fsync (and full_page_writes) off, as
    scripts/pg_test.sh starts test clusters, PostgreSQL's writes are flattered against the file
    store's, which fsync (`PG_DURABLE=1 scripts/pg_test.sh start` keeps them on)."""
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        mode = {
            k: str(conn.execute(f"SHOW {k}").fetchone()[0]) for k in ("fsync", "full_page_writes", "synchronous_commit")
        }  # type: ignore[index]
    mode["durable"] = (
        "yes"
        if mode["fsync"] == "on" and mode["synchronous_commit"] != "off"
        else "NO (fsync off: not comparable with the file store)"
    )
    return mode


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def word(i: int) -> str:
    return f"w{i:05d}x"


def journal_messages(n: int, seed: int = 7) -> Iterator[list[Message]]:
    rnd = random.Random(seed)
    for start in range(0, n, BATCH):
        yield [
            Message.user(" ".join(word(rnd.randrange(VOCABULARY)) for _ in range(WORDS_PER_MESSAGE)))
            for _ in range(min(BATCH, n - start))
        ]


# -- search -------------------------------------------------------------------------------------------
async def search_latency(store: Store, records: int, queries: int) -> dict[str, Any]:
    await store.start()
    t0 = time.perf_counter()
    seen: list[str] = []  # words that are in the journal: every query finds something
    for batch in journal_messages(records):
        await store.append("big", batch, compaction=1)
        seen += batch[0].text.split()
    fill = time.perf_counter() - t0
    # the PostgreSQL store indexes after each batch's commit, in the background: the queries
    # run on the whole index (a search finds what is not indexed yet too, only slower)
    index = getattr(store, "index", None)
    t1 = time.perf_counter()
    if index is not None:
        await index("big")
    catchup = time.perf_counter() - t1
    rnd = random.Random(11)
    times = []
    for _ in range(queries):
        query = f"{rnd.choice(seen)} {rnd.choice(seen)}"
        t = time.perf_counter()
        hits = await store.search("big", query, limit=10)
        times.append(time.perf_counter() - t)
        if not hits:
            raise RuntimeError(f"search for {query!r} found nothing")
    await store.aclose()
    return {
        "fill": fill,
        "index_catchup": catchup,
        "p50": percentile(times, 0.5),
        "p99": percentile(times, 0.99),
        "queries": queries,
    }


# -- one compaction ------------------------------------------------------------------------------------
async def one_compaction(store: Store, messages: int) -> float:
    await store.start()
    rnd = random.Random(3)
    msgs = [Message.user(f"task: {word(1)}")]
    for i in range(messages - 1):
        text = " ".join(word(rnd.randrange(VOCABULARY)) for _ in range(WORDS_PER_MESSAGE))
        msgs.append(Message.user(text) if i % 2 else Message.assistant(text))
    state = State(agent_id="c1", messages=tuple(msgs), config={"compact_keep": ("messages", 20)})
    compactor = Compactor(store=store)  # the offline extractive summarizer
    t0 = time.perf_counter()
    await compactor.force_compact(state)
    elapsed = time.perf_counter() - t0
    await store.aclose()
    return elapsed


def compactions(makers: dict[str, Any], messages: int, reps: int) -> dict[str, tuple[float, list[float]]]:
    """`reps` compactions per store, each on a fresh store from its maker (a context manager
    giving its spec), the stores taking turns so that they see the same load: per store, the
    median and every run (the machine's load moves single runs a lot)."""
    runs: dict[str, list[float]] = {name: [] for name in makers}
    for _ in range(reps):
        for name, make in makers.items():
            with make() as spec:
                runs[name].append(trio.run(one_compaction, open_store(spec), messages))
    return {name: (sorted(r)[len(r) // 2], r) for name, r in runs.items()}


# -- virtual agents (in a subprocess) --------------------------------------------------------------------
class Quick:
    """Answers at once with a short text and usage."""

    async def complete(self, request: ModelRequest) -> Message:
        return Message.assistant("ok", usage=cmdc.TokenUsage(input_tokens=20, output_tokens=1))


def current_rss() -> int:
    """Resident set size now, in bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


async def virtual_agents(
    store_spec: str, agents: int, resident: int, sample: int, concurrency: int = 64
) -> dict[str, Any]:
    """`agents` agents spawned and prompted once each, `concurrency` of them at a time (as
    requests reach a server: a checkpoint write's wait overlaps the others' work)."""
    provider = Quick()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    curve: list[tuple[int, int, float]] = []  # (agents so far, RSS, seconds): what grows with the agents
    step = max(1, agents // 10)
    progress = bool(os.environ.get("CMDC_BENCH_PROGRESS"))
    async with cmdc.open_runtime(store=store_spec, max_resident=resident, log_events=False) as rt:
        refs: list[cmdc.AgentRef] = []
        limiter = trio.Semaphore(concurrency)

        async def one(i: int) -> None:
            try:
                ref = await rt.spawn(f"agent-{i:07d}", provider)
                await ref.prompt("hello")
                refs.append(ref)
            finally:
                limiter.release()

        async with trio.open_nursery() as nursery:
            for i in range(agents):
                await limiter.acquire()
                nursery.start_soon(one, i)
                if (i + 1) % step == 0:
                    curve.append((i + 1, current_rss(), time.perf_counter() - t0))
                    if progress:
                        rss = curve[-1][1] >> 20
                        print(f"{i + 1} agents, {time.perf_counter() - t0:.0f} s, RSS {rss} MiB", file=sys.stderr)
        wall = time.perf_counter() - t0
        await trio.testing.wait_all_tasks_blocked()
        peak_resident = len(rt.resident)
        rnd = random.Random(5)
        picks = [r for r in rnd.sample(refs, min(sample, len(refs))) if not r.resident]
        times = []
        for ref in picks:
            t = time.perf_counter()
            await ref.state()  # activates it from the store
            times.append(time.perf_counter() - t)
        stats = rt.stats
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "agents": agents,
        "resident_bound": resident,
        "resident_after": peak_resident,
        "wall": wall,
        "per_agent_us": wall / agents * 1e6,
        "concurrency": concurrency,
        "peak_rss": peak,
        "activation_p50": percentile(times, 0.5) if times else float("nan"),
        "activation_p99": percentile(times, 0.99) if times else float("nan"),
        "activations": stats["activations"],
        "deactivations": stats["deactivations"],
        "rss_curve": curve,
        "load_before": load_before,
        "load_after": os.getloadavg(),  # (1, 5, 15 minutes) at the start and the end of the run
    }


VIRTUAL_HEAD = (
    "store",
    "agents",
    "resident ≤",
    "wall",
    "ms/agent",
    "peak RSS",
    "RSS growth/agent",
    "activation p50",
    "activation p99",
    "load 1/5/15 min (end)",
)


def virtual_row(name: str, v: dict[str, Any]) -> tuple[str, ...]:
    """One virtual-agents run as the cells of `VIRTUAL_HEAD`."""
    curve = v.get("rss_curve") or []
    growth = "n/a"
    if len(curve) >= 2 and curve[-1][0] > curve[0][0]:  # from the first tenth of the agents to the last
        growth = f"{(curve[-1][1] - curve[0][1]) / (curve[-1][0] - curve[0][0]):,.0f} B"
    load = v.get("load_after")
    return (
        name,
        f"{v['agents']:,}",
        f"{v['resident_bound']:,}",
        f"{v['wall'] / 60:,.1f} min" if v["wall"] >= 120 else f"{v['wall']:,.1f} s",
        f"{v['per_agent_us'] / 1e3:,.2f}",
        f"{v['peak_rss'] / 2**20:,.0f} MiB",
        growth,
        f"{v['activation_p50'] * 1e3:,.2f} ms",
        f"{v['activation_p99'] * 1e3:,.2f} ms",
        "/".join(f"{x:.1f}" for x in load) if load else "n/a",
    )


def virtual_table(runs: dict[str, dict[str, Any]]) -> str:
    """The virtual-agents runs (store name -> result) as an aligned text table."""
    rows = [VIRTUAL_HEAD, *(virtual_row(name, v) for name, v in runs.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(len(VIRTUAL_HEAD))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(rows[0]), "  ".join("-" * w for w in widths), *(line(r) for r in rows[1:])])


def store_table(result: dict[str, Any]) -> str:
    """Every figure of `measure` as text: search and compaction lines, then the virtual agents."""
    out = []
    for name in ("file", "postgres"):
        search = result.get(f"search_{name}")
        if search is not None:
            out.append(
                f"search over {result['records']:,} records, {name}: p50 {search['p50'] * 1e3:,.2f} ms, "
                f"p99 {search['p99'] * 1e3:,.2f} ms"
            )
    for name in ("file", "postgres"):
        median = result.get(f"compaction_{name}")
        if median is not None:
            out.append(
                f"one compaction of {result['compaction_messages']:,} messages, {name}: {median * 1e3:,.1f} ms (median)"
            )
    if "postgres" in result:
        out.append(f"PostgreSQL: {result['postgres']}")
    server = result.get("postgres_server")
    if server is not None:
        out.append(
            f"PostgreSQL server: fsync {server['fsync']}, full_page_writes {server['full_page_writes']}, "
            f"synchronous_commit {server['synchronous_commit']}; durable: {server['durable']}"
        )
    loads = [(k, result[f"load_average_{k}"]) for k in ("start", "end") if f"load_average_{k}" in result]
    if loads:
        out.append("load average 1/5/15 min: " + ", ".join(f"{k} " + "/".join(f"{x:.1f}" for x in v) for k, v in loads))
    runs = {name: result[f"virtual_{name}"] for name in ("file", "postgres") if f"virtual_{name}" in result}
    if runs:
        out += ["", "virtual agents, each prompted once:", virtual_table(runs)]
    return "\n".join(out)


def virtual_in_subprocess(
    store_spec: str, agents: int, resident: int, sample: int, concurrency: int = 64
) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_store",
            "_virtual",
            store_spec,
            str(agents),
            str(resident),
            str(sample),
            str(concurrency),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    if done.returncode != 0:
        raise RuntimeError(f"virtual agents run failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the whole set ------------------------------------------------------------------------------------
def measure(
    records: int,
    queries: int,
    file_queries: int,
    compaction: int,
    agents: int,
    resident: int,
    concurrency: int = 64,
    compaction_reps: int = 3,
) -> dict[str, Any]:
    """Every figure; `compaction_file`/`compaction_postgres` are the medians of
    `compaction_reps` runs (all runs in `..._runs`)."""
    out: dict[str, Any] = {"records": records, "compaction_messages": compaction, "load_average_start": os.getloadavg()}
    base = postgres_base()
    if base is not None:
        out["postgres_server"] = server_mode(base)

    @contextlib.contextmanager
    def directory() -> Iterator[str]:
        with tempfile.TemporaryDirectory() as tmp:
            yield os.path.join(tmp, "c")

    makers: dict[str, Any] = {"file": directory}
    if base is not None:
        makers["postgres"] = lambda: fresh_database(base)
    for name, (median, runs) in compactions(makers, compaction, compaction_reps).items():
        out[f"compaction_{name}"], out[f"compaction_{name}_runs"] = median, runs
    with tempfile.TemporaryDirectory() as tmp:
        out["search_file"] = trio.run(search_latency, open_store(os.path.join(tmp, "s")), records, file_queries)
        if agents:
            out["virtual_file"] = virtual_in_subprocess(os.path.join(tmp, "v"), agents, resident, 200, concurrency)
    if base is None:
        out["postgres"] = 'skipped: no server (eval "$(scripts/pg_test.sh start)" sets CMDC_TEST_POSTGRES_URL)'
        return out
    with fresh_database(base) as url:
        out["search_postgres"] = trio.run(search_latency, open_store(url), records, queries)
    if agents:
        with fresh_database(base) as url:
            out["virtual_postgres"] = virtual_in_subprocess(url, agents, resident, 200, concurrency)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_virtual":
        spec, agents, resident, sample = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        concurrency = int(argv[5]) if len(argv) > 5 else 64
        result = trio.run(virtual_agents, spec, agents, resident, sample, concurrency)
        print(json.dumps(result))
        name = "postgres" if spec.startswith(("postgresql://", "postgres://")) else "file"
        print(virtual_table({name: result}), file=sys.stderr)
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_store")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--file-queries", type=int, default=5)
    parser.add_argument("--compaction", type=int, default=10_000)
    parser.add_argument("--compaction-reps", type=int, default=3, help="compactions per store (median printed)")
    parser.add_argument(
        "--agents",
        type=int,
        default=1_000_000,
        help="virtual agents, each prompted once (0: no such run); the default 1,000,000 takes "
        "35-55 minutes per store on 2 shared cores",
    )
    parser.add_argument("--resident", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64, help="agents prompted at a time")
    parser.add_argument("--json", action="store_true", help="every figure as JSON, not a table")
    args = parser.parse_args(argv)
    result = measure(
        args.records,
        args.queries,
        args.file_queries,
        args.compaction,
        args.agents,
        args.resident,
        args.concurrency,
        args.compaction_reps,
    )
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=2) if args.json else store_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

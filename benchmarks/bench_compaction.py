"""Compaction costs: the per-turn check, one whole compaction, and offload over successive
compactions. Run: python -m benchmarks.bench_compaction  (add --quick for a short run)."""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from cmdc import Compacted, Compactor, Message, OffloadStore, State, estimate_message_tokens
from cmdc.compaction.ledger import read_cues
from cmdc.testing import conversation


async def instant(messages: Sequence[Message], instruction: str) -> str:
    return "summary"


def time_should_compact(compactor: Compactor, state: State, reps: int) -> float:
    """Median seconds per call of should_compact, on a state one append past its last check."""
    samples = []
    for _ in range(reps):
        s = state.append(Message.tool_result("c", "x" * 400))
        t0 = time.perf_counter()
        for _ in range(100):
            compactor.should_compact(s)
        samples.append((time.perf_counter() - t0) / 100)
    return statistics.median(samples)


async def time_compaction(messages: list[Message], root: Path, reps: int, *, restored: bool = False) -> float:
    """Median seconds of one `maybe_compact` of `messages` (instant summarizer, trigger 50k
    tokens, keep 20 messages). The state is built as an agent's is, its messages appended (each
    one's ledger cues read as it arrives); with `restored`, made whole from fresh copies of the
    messages, as a restored or imported state is (encoded, their cues not read: the compaction
    reads them)."""
    samples = []
    for rep in range(reps):
        config = {
            "compact_trigger": ("tokens", 50_000),
            "compact_keep": ("messages", 20),
            "compact_offload_dir": str(root),
        }
        agent = f"agent-{len(messages)}-{rep}-{restored}"
        if restored:
            state = State(agent_id=agent, messages=[m.evolve() for m in messages], config=config)
        else:
            state = State(agent_id=agent, config=config).append(*messages)
        compactor = Compactor(instant)
        gc.collect()  # the setup's garbage is not the compaction's cost
        t0 = time.perf_counter()
        result = await compactor.maybe_compact(state)
        samples.append(time.perf_counter() - t0)
        assert isinstance(result, Compacted)
    return statistics.median(samples)


async def time_successive_offloads(root: Path, batches: int, size: int, agent_id: str = "successive") -> list[float]:
    store = OffloadStore(root)
    out = []
    for i in range(batches):
        batch = conversation(size, seed=100 + i, system=False)
        t0 = time.perf_counter()
        await store.append(agent_id, batch, compaction=i + 1)
        out.append(time.perf_counter() - t0)
    return out


def time_append(reps: int, base: int = 10_000, batch: int = 1_000) -> tuple[float, float, float]:
    """Seconds per message: (1) preparing a message as it enters a state (token estimate, JSON
    encoding and its checksum, done once so a compaction only copies bytes), (2) reading its
    ledger cues (`read_cues`: what the ledger takes of it, read once as it arrives), and (3) the
    whole `State.append` of one message onto a `base`-message state (its token estimate, its
    cues and the copy of the tuple; its JSON encoded before, as (1) leaves it)."""
    prepare, cues, append = [], [], []
    state = State(agent_id="app", messages=conversation(base, seed=7))
    for r in range(reps):
        messages = conversation(batch, seed=500 + r, system=False)
        t0 = time.perf_counter()
        for m in messages:
            estimate_message_tokens(m)
            m.json_crc()
        prepare.append((time.perf_counter() - t0) / len(messages))
        t0 = time.perf_counter()
        for m in messages:
            read_cues(m)
        cues.append((time.perf_counter() - t0) / len(messages))
        fresh = [m.evolve() for m in messages]
        for m in fresh:
            m.json_crc()
        t0 = time.perf_counter()
        for m in fresh:
            state.append(m)
        append.append((time.perf_counter() - t0) / len(messages))
    return statistics.median(prepare), statistics.median(cues), statistics.median(append)


async def time_default(
    n: int, root: Path, reps: int, trigger: int | None, extractive: bool = False
) -> tuple[float, float, int, int]:
    """One `force_compact` of an `n`-message conversation by a Compactor with every default
    (finalizer, preserved user messages, task pin, budgets: every retention feature on), with
    the default trigger or `trigger`; the summarizer answers at once unless `extractive` (the
    offline default, whose own time grows with its input): (median wall seconds, median CPU
    seconds of the process, summary tokens, tokens after). CPU time is what the compaction
    costs whatever else the machine runs; wall time includes the journal's fsync. A full
    garbage collection runs before each timed compaction, so that the collection of the n
    messages just generated is not counted as the compaction's."""
    messages = conversation(n, seed=n)
    samples, cpu, summary, after = [], [], 0, 0
    for rep in range(reps):
        config: dict[str, object] = {"compact_offload_dir": str(root)}
        if trigger is not None:
            config["compact_trigger"] = ("tokens", trigger)
        # built as an agent's state is, its messages appended (see `time_compaction`)
        state = State(agent_id=f"default-{n}-{trigger}-{extractive}-{rep}", config=config).append(*messages)
        compactor = Compactor() if extractive else Compactor(instant)
        gc.collect()  # the setup's garbage (n new messages) is not the compaction's cost
        t0, c0 = time.perf_counter(), time.process_time()
        result = await compactor.force_compact(state)
        samples.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        assert isinstance(result, Compacted)
        summary, after = result.report.summary_tokens, result.report.tokens_after
    return statistics.median(samples), statistics.median(cpu), summary, after


async def time_chained(root: Path, rounds: int, batch: int = 40) -> list[tuple[int, float, int, float]]:
    """`rounds` chained compactions by the default Compactor with a 10^9 trigger: before each,
    `batch` new messages are appended; (compaction number, seconds, summary tokens, CPU
    seconds) per round."""
    state = State(agent_id="chained", config={"compact_trigger": ("tokens", 10**9), "compact_offload_dir": str(root)})
    compactor = Compactor()
    out = []
    for i in range(rounds):
        state = state.append(*conversation(batch, seed=1_000 + i, system=False, usage=False))
        t0, c0 = time.perf_counter(), time.process_time()
        result = await compactor.force_compact(state)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert isinstance(result, Compacted)
        state = result.state
        out.append((i + 1, seconds, result.report.summary_tokens, cpu))
    return out


def _cold(path: Path | None = None) -> str:
    """Make the page cache cold: as root, write back and drop every clean page (`echo 3 >
    /proc/sys/vm/drop_caches`); else drop the pages of `path` (POSIX_FADV_DONTNEED). Returns
    which of the two was done."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        if path is not None and path.exists():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def bare_write(data: bytes, path: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of a bare write + fsync of `data` to the fresh file `path`."""
    t0, c0 = time.perf_counter(), time.process_time()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0, time.process_time() - c0


async def floor_row(n: int, root: Path, reps: int = 9, cold: bool = True) -> dict[str, float | int | str]:
    """cmdc's full forced compaction of `n` messages (default Compactor, instant summarizer,
    default trigger) against a bare write + fsync of the same bytes its journal holds (read
    back from it: the batch, its journal line and its commit), to a fresh file in the same
    directory, in this process; interleaved, `reps` times each, the page cache made cold
    before each timed operation when `cold`. Medians of wall and CPU seconds."""
    messages = conversation(n, seed=n)
    walls: dict[str, list[float]] = {"bare": [], "cmdc": []}
    cpus: dict[str, list[float]] = {"bare": [], "cmdc": []}
    how, size = "warm", 0
    for rep in range(reps):
        agent = f"floor-{n}-{rep}"
        state = State(agent_id=agent, config={"compact_offload_dir": str(root)}).append(*messages)  # an agent's
        compactor = Compactor(instant)
        gc.collect()
        if cold:
            how = _cold()
        t0, c0 = time.perf_counter(), time.process_time()
        result = await compactor.force_compact(state)
        walls["cmdc"].append(time.perf_counter() - t0)
        cpus["cmdc"].append(time.process_time() - c0)
        assert isinstance(result, Compacted)
        journal = root / f"{agent}.jsonl"
        data = journal.read_bytes()
        size = len(data)
        bare = root / f"bare-{n}-{rep}.bin"
        if cold:
            how = _cold(journal)
        wall, cpu = bare_write(data, bare)
        walls["bare"].append(wall)
        cpus["bare"].append(cpu)
        del data
        journal.unlink()
        bare.unlink()
    out: dict[str, float | int | str] = {"messages": n, "bytes": size, "cache": how if cold else "warm"}
    for kind in ("bare", "cmdc"):
        out[f"{kind}_wall"] = statistics.median(walls[kind])
        out[f"{kind}_cpu"] = statistics.median(cpus[kind])
    out["ratio"] = float(out["cmdc_wall"]) / float(out["bare_wall"])
    return out


async def floor_table(sizes: Sequence[int], reps: int = 9, cold: bool = True) -> None:
    """Prints, per size, the bare write+fsync floor, cmdc's compaction and their ratio."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nthe disk floor: bare write+fsync of the journal's bytes vs one force_compact (median of {reps},")
    print(f"interleaved, default Compactor, instant summarizer; load average {load:.1f} at the start)")
    print(
        f"{'messages':>9} {'MB':>6} {'cache':>12} {'bare wall':>10} {'bare cpu':>9} {'cmdc wall':>10}"
        f" {'cmdc cpu':>9} {'ratio':>6} {'target':>7} {'load':>5}"
    )
    with tempfile.TemporaryDirectory(dir=os.environ.get("CMDC_BENCH_DIR")) as tmp:
        for n in sizes:
            row = await floor_row(n, Path(tmp), reps, cold)
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            print(
                f"{n:>9} {int(row['bytes']) / 1e6:>6.1f} {row['cache']!s:>12} {float(row['bare_wall']) * 1e3:>10.1f}"
                f" {float(row['bare_cpu']) * 1e3:>9.1f} {float(row['cmdc_wall']) * 1e3:>10.1f}"
                f" {float(row['cmdc_cpu']) * 1e3:>9.1f} {float(row['ratio']):>6.2f} {'<= 2':>7} {load:>5.1f}"
            )


async def default_table(
    sizes: Sequence[int], reps: int, rounds: int, summarizers: Sequence[bool] = (False, True)
) -> None:
    """Prints the default-Compactor figures: one force_compact per size and trigger, and the
    summary's size over chained compactions."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\ndefault Compactor, every retention feature on, one force_compact (load average {load:.1f})")
    print(
        f"{'messages':>9} {'trigger':>9} {'summarizer':>11} {'wall ms':>9} {'cpu ms':>9} {'target':>7}"
        f" {'summary tok':>12} {'tokens after':>13}"
    )
    summaries: dict[int, int] = {}  # size -> summary tokens (instant summarizer, default trigger)
    with tempfile.TemporaryDirectory() as tmp:
        for extractive in summarizers:
            for n in sizes:
                for trigger in (None, 10**9):
                    seconds, cpu, summary, after = await time_default(n, Path(tmp), reps, trigger, extractive)
                    target = None if extractive else TARGETS_MS.get(n)
                    if trigger is None:
                        summaries.setdefault(n, summary)
                    print(
                        f"{n:>9} {'default' if trigger is None else '1e9':>9} "
                        f"{'extractive' if extractive else 'instant':>11} {seconds * 1e3:>9.1f} {cpu * 1e3:>9.1f} "
                        f"{'' if target is None else f'< {target:.0f}':>7} {summary:>12,} {after:>13,}"
                    )
        chain = await time_chained(Path(tmp), rounds) if rounds else []
    if chain:
        print(f"\n{rounds} chained compactions (40 new messages each, trigger 1e9, default Compactor)")
        print(f"{'compaction':>11} {'wall ms':>9} {'cpu ms':>9} {'summary tok':>12}")
        marks = sorted({1, 2, 10, 100, rounds // 2, rounds} & set(range(1, rounds + 1)))
        for number, seconds, summary, cpu in chain:
            if number in marks:
                print(f"{number:>11} {seconds * 1e3:>9.1f} {cpu * 1e3:>9.1f} {summary:>12,}")
        k = min(100, max(1, rounds // 10))
        head, tail = chain[:k], chain[-k:]

        def ms(rows: list[tuple[int, float, int, float]], i: int) -> float:
            return statistics.median(c[i] for c in rows) * 1e3

        print(
            f"  per compaction, first {k} vs last {k}: median wall {ms(head, 1):.1f} vs {ms(tail, 1):.1f} ms,"
            f" median cpu {ms(head, 3):.1f} vs {ms(tail, 3):.1f} ms;"
            f" summary tokens {max(c[2] for c in head):,} vs {max(c[2] for c in tail):,} (largest)"
        )
    sizes_text = ", ".join(f"{n:,} messages {t:,}" for n, t in summaries.items())
    after = f"; after {rounds:,} chained compactions {chain[-1][2]:,}" if chain else ""
    print(f"\nsummary tokens (default Compactor, default trigger): {sizes_text}{after}")


TARGETS_MS = {1_000: None, 10_000: 30.0, 50_000: 150.0}  # one compaction, by conversation size
CHECK_TARGET_US = 20.0


@attrs.frozen
class Size:
    """The figures at one conversation size (`n` asked for, `messages` generated)."""

    n: int
    messages: int
    check: float  # seconds per should_compact
    compaction: float  # seconds per maybe_compact (a state built by appends, as an agent's)
    restored: float  # the same of a restored state (its messages' ledger cues not read yet)

    @property
    def target_ms(self) -> float | None:
        return TARGETS_MS.get(self.n)


@attrs.frozen
class Figures:
    sizes: list[Size]
    prepare: float  # seconds per message
    cues: float  # seconds per message: its ledger cues
    append: float  # seconds per State.append onto `append_base` messages
    append_base: int
    offloads: list[float]  # seconds per successive offload


async def measure(
    sizes: Sequence[int] = (1_000, 10_000, 50_000),
    reps: int = 5,
    *,
    append_base: int = 10_000,
    offload_batches: int = 5,
    offload_size: int = 1_000,
    offload_series: int = 1,
) -> Figures:
    """Every figure of this benchmark (`main` prints them). With `offload_series` > 1 the
    successive offloads run that many times, each into a fresh journal, and each position's
    figure is the median (fsync times are noisy)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            messages = conversation(n, seed=n)
            check = time_should_compact(
                Compactor(instant),
                State(agent_id="chk", messages=messages, config={"compact_trigger": ("tokens", 10**12)}),
                reps * 4,
            )
            compaction = await time_compaction(messages, Path(tmp), reps)
            restored = await time_compaction(messages, Path(tmp), reps, restored=True)
            out.append(Size(n, len(messages), check, compaction, restored))
        prepare, cues, append = time_append(reps, append_base, min(1_000, append_base))
        series = [
            await time_successive_offloads(Path(tmp), offload_batches, offload_size, f"successive-{k}")
            for k in range(offload_series)
        ]
        offloads = [statistics.median(times) for times in zip(*series, strict=True)]
    return Figures(out, prepare, cues, append, append_base, offloads)


async def main(
    quick: bool, default_only: bool = False, rounds: int | None = None, only: str = "both", floor: bool = False
) -> None:
    if floor:
        await floor_table((1_000, 10_000) if quick else (10_000, 50_000), 3 if quick else 9)
        return
    if default_only:
        sizes = (1_000, 10_000) if quick else (1_000, 10_000, 50_000)
        kinds = {"both": (False, True), "instant": (False,), "extractive": (True,)}[only]
        await default_table(sizes, 3, (100 if quick else 1_000) if rounds is None else rounds, kinds)
        return
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 50_000)
    figures = await measure(sizes, 3 if quick else 5)
    print("cmdc compaction benchmark (instant summarizer, ~400-char messages)")
    print(
        f"{'messages':>9} {'should_compact µs':>18} {'target':>7} {'compaction ms':>14} {'target':>7}"
        f" {'restored state ms':>18}"
    )
    for size in figures.sizes:
        target = size.target_ms
        print(
            f"{size.messages:>9} {size.check * 1e6:>18.2f} {'< 20':>7} {size.compaction * 1e3:>14.1f} "
            f"{'' if target is None else f'< {target:.0f}':>7} {size.restored * 1e3:>18.1f}"
        )
    print(
        "  (compaction: a state built by appends, as an agent's; restored: made whole from its messages,"
        " whose ledger cues the compaction reads)"
    )
    print(
        f"\nper message entering a state, once: {figures.prepare * 1e6:.1f} µs to prepare (estimate, encode, "
        f"checksum), {figures.cues * 1e6:.1f} µs to read its ledger cues; State.append onto 10k messages: "
        f"{figures.append * 1e6:.1f} µs (estimate, cues and the tuple copy; encoded before)"
    )
    offloads = figures.offloads
    print("\noffload of 5 successive compactions of ~1k messages into one journal (ms):")
    print("  " + "  ".join(f"#{i + 1}: {t * 1e3:.1f}" for i, t in enumerate(offloads)))
    print(f"  5th / 1st: {offloads[-1] / offloads[0]:.2f}")
    await default_table(sizes, 3, 100 if quick else 1_000)
    await floor_table((1_000, 10_000) if quick else (10_000, 50_000), 3 if quick else 9)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--default-only", action="store_true", help="only the default-Compactor figures")
    parser.add_argument("--rounds", type=int, default=None, help="chained compactions (default 1,000)")
    parser.add_argument("--summarizer", choices=("both", "instant", "extractive"), default="both")
    parser.add_argument("--floor", action="store_true", help="only the disk-floor row (bare write+fsync vs cmdc)")
    args = parser.parse_args()
    trio.run(main, args.quick, args.default_only, args.rounds, args.summarizer, args.floor)

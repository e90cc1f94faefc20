"""Crash test: kill a compacting process with SIGKILL at random moments, then check that nothing
it acknowledged is lost.

Run: python -m benchmarks.crash_test [--kills 100] [--seed 7] [--max-delay 0.3] [--dir DIR]

A writer process (this module with --writer) resumes the agent from its last checkpoint and
loops: it grows the conversation (user messages, tool calls and their results, answers, of
random sizes), compacts it with `Compactor.force_compact` (the evicted messages are appended to
the agent's offload journal and fsync'd before it goes on), and saves the new `State` with
`CheckpointStore`. It prints

    A <seq> <message id>      for each journal record, once the append has returned (fsync'd)
    C <compactions> <ids>     once the checkpoint of that State is saved (fsync'd, renamed, and
                              the directory fsync'd)

Its writes reach the kernel in short pieces (--piece bytes), as short writes would, so a kill
can land inside a record. The parent kills it with SIGKILL after a random delay, then recovers
and checks, every time:

- the journal parses (`OffloadStore.records`), its records are numbered 1..n with no gap and no
  duplicate, and every acknowledged record is there, under its seq, in order;
- a reader (`OffloadStore.read`) sees every acknowledged message, each once;
- the last checkpoint loads (`CheckpointStore.load`): it is the last acknowledged one or a newer
  one, and every summary in it names a range of records all on disk;
- no message of any acknowledged checkpoint is lost: each is in the loaded State or the journal;
- a new append (a new process's) truncates a torn tail and gets the next seq.

It prints one line with the counts; the exit status is 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import trio

from cmdc import Compacted, Compactor, ExtractiveSummarizer, Message, OffloadStore, State, ToolCall
from cmdc.checkpoint import CheckpointStore
from cmdc.errors import CmdcError
from cmdc.offload import AppendResult

AGENT = "crash"
ROOT = Path(__file__).resolve().parent.parent


def agent_config(directory: Path) -> dict[str, Any]:
    return {
        "compact_offload_dir": str(directory / "offload"),
        "compact_keep": ("messages", 4),
        "compact_trigger": ("messages", 1_000_000),
    }


# -- the writer ------------------------------------------------------------------------------------


def _short_writes(piece: int) -> None:
    """Make every os.write of this process write at most `piece` bytes (callers loop)."""
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        return real_write(fd, memoryview(data)[:piece])

    os.write = write


def _round(state: State, rng: random.Random) -> State:
    """A user message, 0-2 tool calls with their results, an answer; sizes from 20 B to 6 KB."""

    def text(what: str) -> str:
        return f"{what} " + secrets.token_hex(rng.choice((10, 100, 400, 3_000)))

    messages = [Message.user(text("please"))]
    calls = [
        ToolCall(id=f"c{secrets.token_hex(6)}", name="read_file", arguments={"path": text("src")[:40]})
        for _ in range(rng.randint(0, 2))
    ]
    if calls:
        messages.append(Message.assistant("", tool_calls=calls))
        messages += [Message.tool_result(c.id, text("contents")) for c in calls]
    messages.append(Message.assistant(text("done")))
    return state.append(*messages)


def _say(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


async def writer(directory: Path, seed: int, piece: int) -> None:
    if piece:
        _short_writes(piece)
    rng = random.Random(seed)
    checkpoints = CheckpointStore(directory / "ckpt")
    state = await checkpoints.load(AGENT)
    if state is None:
        state = State(
            agent_id=AGENT, messages=(Message.system("You are a careful agent."),), config=agent_config(directory)
        )
    compactor = Compactor(ExtractiveSummarizer(), retries=0)
    store = compactor.store_for(compactor.compact_config(state))
    append = store.append

    async def acknowledged(agent_id: str, messages: Sequence[Message], *, compaction: int = 0) -> AppendResult:
        result = await append(agent_id, messages, compaction=compaction)
        # One process, no failures: every batch is new, written whole, numbered in order.
        assert result.written == len(messages) == result.last_seq - result.first_seq + 1
        _say("".join(f"A {seq} {m.id}\n" for seq, m in enumerate(messages, result.first_seq)))
        return result

    store.append = acknowledged  # type: ignore[method-assign]
    _say("R\n")
    while True:
        for _ in range(rng.randint(1, 3)):
            state = _round(state, rng)
        outcome = await compactor.force_compact(state)
        if isinstance(outcome, Compacted):  # each checkpoint has its own compaction number
            state = outcome.state
            await checkpoints.save(state)
            _say(f"C {state.compactions} {','.join(m.id for m in state.messages)}\n")


# -- the parent ------------------------------------------------------------------------------------


class Ledger:
    """What the writers acknowledged, over every run."""

    def __init__(self) -> None:
        self.records: dict[int, str] = {}  # seq -> message id
        self.checkpoint: tuple[int, list[str]] | None = None  # the last acknowledged one
        self.checkpointed: set[str] = set()  # every message id of every acknowledged checkpoint
        self.checkpoints = 0

    def take(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "A":
            seq, message_id = rest.split()
            self.records[int(seq)] = message_id
        elif kind == "C":
            compactions, ids = rest.split()
            self.checkpoint = (int(compactions), ids.split(","))
            self.checkpointed.update(self.checkpoint[1])
            self.checkpoints += 1


def raw_records(path: Path) -> tuple[list[tuple[int, str]], bool]:
    """(seq, message id) of each complete line, and whether a torn tail follows them."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], False
    lines = data.split(b"\n")
    torn = lines.pop() != b""
    out = []
    for line in lines:
        obj = orjson.loads(line)
        out.append((obj["seq"], obj["message"]["id"]))
    return out, torn


def check(directory: Path, ledger: Ledger, kill: int) -> tuple[list[str], dict[str, int]]:
    """Recover after a kill and check every promise; return (failures, counts)."""
    failures: list[str] = []
    counts: Counter[str] = Counter()
    journal = directory / "offload" / f"{AGENT}.jsonl"

    def fail(what: str) -> None:
        failures.append(f"kill {kill}: {what}")

    try:
        records = trio.run(OffloadStore(directory / "offload").records, AGENT)
    except CmdcError as exc:
        fail(f"the journal does not parse: {exc!r}")
        return failures, counts
    raw, torn = raw_records(journal)
    counts["torn"] = torn
    seqs = [s for s, _ in raw]
    if seqs != list(range(1, len(seqs) + 1)):
        fail(f"journal seqs are not 1..{len(seqs)} (a gap or a duplicate)")
    for seq, message_id in ledger.records.items():
        if seq > len(raw) or raw[seq - 1] != (seq, message_id):
            fail(f"acknowledged record {seq} ({message_id}) is not on disk")
            break
    counts["mid_batch"] = bool(seqs) and seqs[-1] > max(ledger.records, default=0)
    seen = [r.message.id for r in records]
    if len(seen) != len(set(seen)) or [r.seq for r in records] != sorted(r.seq for r in records):
        fail("a reader sees a message twice or out of order")
    if not set(ledger.records.values()) <= set(seen):
        fail("a reader misses an acknowledged message")

    try:
        state = trio.run(CheckpointStore(directory / "ckpt").load, AGENT)
    except CmdcError as exc:
        fail(f"the checkpoint does not load: {exc!r}")
        return failures, counts
    if ledger.checkpoint is not None:
        compactions, ids = ledger.checkpoint
        if state is None:
            fail("an acknowledged checkpoint is gone")
            return failures, counts
        if state.compactions < compactions or (
            state.compactions == compactions and [m.id for m in state.messages] != ids
        ):
            fail("the checkpoint is older than the last acknowledged one")
        counts["newer_checkpoint"] = state.compactions > compactions
    if state is not None:
        on_disk = set(seqs)
        for m in state.messages:
            if m.is_summary:
                first, last = m.metadata["cmdc.first_seq"], m.metadata["cmdc.last_seq"]
                if not set(range(first, last + 1)) <= on_disk:
                    fail(f"the checkpoint's summary names records {first}-{last}, not all on disk")
        lost = ledger.checkpointed - {m.id for m in state.messages} - set(seen)
        if lost:
            fail(f"{len(lost)} message(s) of acknowledged checkpoints are lost")
    counts["temp_files"] = (directory / "ckpt").exists() and any((directory / "ckpt").glob(".*.tmp"))

    # Recovery: a new process appends; a torn tail is truncated first.
    probe = Message.user(f"recovery probe after kill {kill}")
    try:
        result = trio.run(OffloadStore(directory / "offload").append, AGENT, [probe])
    except CmdcError as exc:
        fail(f"the append after recovery failed: {exc!r}")
        return failures, counts
    after, torn_after = raw_records(journal)
    if torn_after or result.first_seq != len(raw) + 1 or after != [*raw, (result.first_seq, probe.id)]:
        fail("recovery did not truncate the torn tail and append the next seq")
    ledger.records[result.first_seq] = probe.id
    return failures, dict(counts)


def run(
    kills: int = 100,
    *,
    seed: int = 7,
    max_delay: float = 0.3,
    piece: int = 16,
    directory: Path | None = None,
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the test; return its figures (`failures` lists what went wrong, if anything)."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cmdc-crash-") as tmp:
        where = directory if directory is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        ledger = Ledger()
        failures: list[str] = []
        totals: Counter[str] = Counter()
        started = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for kill in range(1, kills + 1):
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "benchmarks.crash_test", "--writer", str(where)),
                    *("--seed", str(rng.randrange(2**32)), "--piece", str(piece)),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=ROOT,
                env=env,
                text=True,
            )
            assert proc.stdout is not None and proc.stderr is not None
            ready = threading.Event()
            lines: list[str] = []

            def read(stream: Any = proc.stdout, lines: list[str] = lines, ready: threading.Event = ready) -> None:
                for line in stream:
                    if line == "R\n":
                        ready.set()
                    elif line.endswith("\n"):  # a line cut by the kill was never acknowledged
                        lines.append(line[:-1])
                ready.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            if not ready.wait(60):
                proc.kill()
                failures.append(f"kill {kill}: the writer did not start")
                break
            time.sleep(rng.uniform(0, max_delay))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            reader.join()
            if proc.returncode != -signal.SIGKILL:
                failures.append(
                    f"kill {kill}: the writer ended by itself ({proc.returncode}): {proc.stderr.read()[-2000:]}"
                )
                break
            proc.stderr.close()
            proc.stdout.close()
            for line in lines:
                ledger.take(line)
            found, counts = check(where, ledger, kill)
            failures += found
            totals.update(counts)
            totals["kills"] += 1
        elapsed = time.perf_counter() - started
        figures = {
            "kills": totals["kills"],
            "failures": failures,
            "records": len(ledger.records),
            "checkpoints": ledger.checkpoints,
            "torn_tails": totals["torn"],
            "mid_batch": totals["mid_batch"],
            "newer_checkpoint": totals["newer_checkpoint"],
            "temp_files": totals["temp_files"],
            "seconds": elapsed,
        }
    for failure in failures[:20]:
        out(f"FAILED {failure}")
    out(
        f"crash test: {figures['kills']} SIGKILLs, {len(failures)} failures; "
        f"{figures['records']:,} acknowledged journal records all on disk, in order, no gap, no duplicate; "
        f"{figures['checkpoints']:,} acknowledged checkpoints, the last (or a newer) one loaded after every kill; "
        f"{figures['torn_tails']} torn tails truncated by recovery; "
        f"{figures['mid_batch']} kills inside a batch (its whole records stay, unacknowledged); "
        f"{figures['newer_checkpoint']} kills between a checkpoint's rename and its acknowledgement; "
        f"{figures['temp_files']} kills inside a checkpoint save (the temp file is ignored by loads); "
        f"{elapsed:.1f} s"
    )
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=100, help="how many times to SIGKILL the writer (default 100)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-delay", type=float, default=0.3, help="longest wait before a kill, seconds")
    parser.add_argument("--piece", type=int, default=16, help="bytes per write() in the writer (0: whole)")
    parser.add_argument("--dir", type=Path, default=None, help="keep the files here (default: a temp dir)")
    parser.add_argument("--writer", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer is not None:
        trio.run(writer, args.writer, args.seed, args.piece)
        return
    figures = run(args.kills, seed=args.seed, max_delay=args.max_delay, piece=args.piece, directory=args.dir)
    sys.exit(1 if figures["failures"] else 0)


if __name__ == "__main__":
    main()

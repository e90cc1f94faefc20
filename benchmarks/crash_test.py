"""Crash test: kill a compacting process with SIGKILL at random moments, then check that nothing
it acknowledged is lost.

Run: python -m benchmarks.crash_test [--kills 100] [--seed 7] [--max-delay 0.3] [--dir DIR]

A writer process (this module with --writer) resumes the agent from its last checkpoint (and,
as a resumed agent does, commits that state's journal attempts), then loops the way an agent
commits: it grows the conversation (user messages, tool calls and their results, answers, of
random sizes), compacts it with `Compactor(commit_journal=False).force_compact` (the evicted
messages are appended to the journal as an uncommitted attempt, fsync'd), and then either
abandons the compaction (one time in three, as a failed step does: the next compaction retries
the same messages) or saves the new `State` with `CheckpointStore` and commits the attempt. It
prints

    A <attempt> <seq>:<id>,...  once an attempt's batch is appended (fsync'd, not yet visible)
    X <attempt>                 when that compaction is abandoned (never committed)
    S <attempts> <ids>          the attempts and messages of a compaction about to be committed,
                                before its checkpoint is saved
    C <compactions> <ids>       once the checkpoint of that State is saved (fsync'd, renamed, and
                                the directory fsync'd)
    K <attempts>                once the commit line is fsync'd

Its writes reach the kernel in short pieces (--piece bytes), as short writes would, so a kill
can land inside a record, and between an attempt and its commit. The parent kills it with
SIGKILL after a random delay, then recovers (the resumed state's attempts are committed, as an
agent's resume does) and checks, every time:

- the journal has no damaged line (a torn tail at most); message record numbers only grow;
- a reader (`OffloadStore.read`) sees each message once, at the record number its first
  acknowledged append gave it (stable addresses);
- it sees every message evicted by an acknowledged checkpoint, and nothing of an abandoned
  attempt unless a committed one evicted the same message (exactly once, as readers see it);
- the last checkpoint loads (`CheckpointStore.load`): it is the last acknowledged one or a newer
  one, and every summary in it names a range of records all on disk;
- no message of any acknowledged checkpoint is lost: each is in the loaded State or the journal;
- a new append (a new process's) moves a torn tail aside and appends after the last record.

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

import trio

from cmdc import Compacted, Compactor, ExtractiveSummarizer, Message, OffloadStore, State, ToolCall
from cmdc.checkpoint import CheckpointStore
from cmdc.errors import CmdcError
from cmdc.offload import AppendResult, OffloadCorrupted, _decode_line

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
    compactor = Compactor(ExtractiveSummarizer(), retries=0, commit_journal=False)
    await compactor.commit(state)  # a resumed agent commits its state's attempts
    store = compactor.store_for(compactor.compact_config(state))
    append, commit = store.append, store.commit

    async def acknowledged(agent_id: str, messages: Sequence[Message], **options: Any) -> AppendResult:
        result = await append(agent_id, messages, **options)
        pairs = ",".join(f"{seq}:{m.id}" for seq, m in zip(result.seqs, messages, strict=True))
        _say(f"A {result.attempt} {pairs}\n")
        return result

    async def committed(agent_id: str, attempts: Sequence[str], **options: Any) -> bool:
        wrote = await commit(agent_id, attempts, **options)
        _say(f"K {','.join(attempts)}\n")
        return wrote

    store.append = acknowledged  # type: ignore[method-assign]
    store.commit = committed  # type: ignore[method-assign]
    _say("R\n")
    while True:
        for _ in range(rng.randint(1, 3)):
            state = _round(state, rng)
        outcome = await compactor.force_compact(state)
        if not isinstance(outcome, Compacted):
            continue
        summary = next(m for m in outcome.state.messages if m.is_summary)
        if rng.random() < 1 / 3:  # the step fails after the compaction: its state is thrown away
            _say(f"X {','.join(summary.metadata['cmdc.attempts'])}\n")
            continue
        kept = {m.id for m in outcome.state.messages}
        evicted = ",".join(m.id for m in state.messages if m.id not in kept) or "-"
        _say(f"S {','.join(summary.metadata['cmdc.attempts']) or '-'} {evicted}\n")
        state = outcome.state
        await checkpoints.save(state)  # each checkpoint has its own compaction number
        _say(f"C {state.compactions} {','.join(m.id for m in state.messages)}\n")
        await compactor.commit(state)


# -- the parent ------------------------------------------------------------------------------------


class Ledger:
    """What the writers acknowledged, over every run."""

    def __init__(self) -> None:
        self.address: dict[str, int] = {}  # message id -> its record number, once a commit is intended
        self.attempts: dict[str, list[tuple[str, int]]] = {}  # attempt -> (message id, record number)
        self.abandoned: set[str] = set()
        self.intended: set[str] = set()  # every message id an S line names (committed or about to be)
        self.evicted: set[str] = set()  # ... of which the checkpoint was acknowledged
        self.pending_evicted: set[str] = set()
        self.pending_attempts: list[str] = []
        self.checkpoint: tuple[int, list[str]] | None = None  # the last acknowledged one
        self.checkpointed: set[str] = set()  # every message id of every acknowledged checkpoint
        self.checkpoints = 0
        self.commits = 0

    def take(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "A":
            attempt, pairs = rest.split()
            self.attempts[attempt] = [(i, int(seq)) for seq, i in (p.split(":") for p in pairs.split(","))]
        elif kind == "X":
            self.abandoned.update(rest.split(","))
        elif kind == "S":
            attempts, ids = rest.split()
            self.pending_attempts = attempts.split(",")
            self.pending_evicted = set(ids.split(",")) - {"-"}
            self.intended |= self.pending_evicted
        elif kind == "C":
            compactions, ids = rest.split()
            self.checkpoint = (int(compactions), ids.split(","))
            self.checkpointed.update(self.checkpoint[1])
            self.evicted |= self.pending_evicted
            for attempt in self.pending_attempts:  # committed: its record numbers are addresses now
                for message_id, seq in self.attempts.get(attempt, ()):
                    self.address.setdefault(message_id, seq)
            self.checkpoints += 1
        elif kind == "K":
            self.commits += 1


def raw_lines(path: Path) -> tuple[list[Any], bool, bool]:
    """Each complete line decoded, whether a torn tail follows them, and whether the journal
    ends with records of an attempt not committed yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], False, False
    lines = data.split(b"\n")
    torn = lines.pop() != b""
    out = [_decode_line(line, f"{path}: line {n}") for n, line in enumerate(lines, 1)]
    return out, torn, bool(out) and out[-1].kind == "message"


def check(directory: Path, ledger: Ledger, kill: int) -> tuple[list[str], dict[str, int]]:
    """Recover after a kill and check every promise; return (failures, counts)."""
    failures: list[str] = []
    counts: Counter[str] = Counter()
    journal = directory / "offload" / f"{AGENT}.jsonl"

    def fail(what: str) -> None:
        failures.append(f"kill {kill}: {what}")

    try:
        state = trio.run(CheckpointStore(directory / "ckpt").load, AGENT)
    except CmdcError as exc:
        fail(f"the checkpoint does not load: {exc!r}")
        return failures, counts
    try:
        raw, torn, open_attempt = raw_lines(journal)
    except OffloadCorrupted as exc:
        fail(f"a complete journal line is damaged: {exc}")
        return failures, counts
    counts["torn"] = torn
    counts["between_attempt_and_commit"] = open_attempt
    seqs = [line.seq for line in raw if line.kind == "message"]
    if seqs != sorted(set(seqs)):
        fail("journal record numbers do not grow (a duplicate or a step back)")
    if state is not None:  # recovery: as a resumed agent does, commit the state's attempts
        try:
            trio.run(Compactor(commit_journal=False).commit, state)
        except CmdcError as exc:
            fail(f"the resumed state's commit failed: {exc!r}")
    try:
        records = trio.run(OffloadStore(directory / "offload").records, AGENT)
    except CmdcError as exc:
        fail(f"the journal cannot be read: {exc!r}")
        return failures, counts
    seen = [r.message.id for r in records]
    if len(seen) != len(set(seen)) or [r.seq for r in records] != sorted(r.seq for r in records):
        fail("a reader sees a message twice or out of order")
    moved = [r for r in records if r.message.id in ledger.address and ledger.address[r.message.id] != r.seq]
    if moved:
        first = ", ".join(f"{r.message.id} at {r.seq}, not {ledger.address[r.message.id]}" for r in moved[:3])
        fail(f"{len(moved)} message(s) read at another record number than their append gave them: {first}")
    in_state = set() if state is None else {m.id for m in state.messages}
    if not ledger.evicted <= set(seen) | in_state:
        fail("a reader misses a message an acknowledged checkpoint evicted")
    stray = set(seen) - ledger.intended
    if stray:
        fail(f"{len(stray)} message(s) of abandoned attempts are visible")
    counts["abandoned_attempts"] = len(ledger.abandoned)

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
        lost = ledger.checkpointed - in_state - set(seen)
        if lost:
            fail(f"{len(lost)} message(s) of acknowledged checkpoints are lost")
    counts["temp_files"] = (directory / "ckpt").exists() and any((directory / "ckpt").glob(".*.tmp"))

    # Recovery: a new process appends; a torn tail is moved aside first.
    probe = Message.user(f"recovery probe after kill {kill}")
    try:
        result = trio.run(OffloadStore(directory / "offload").append, AGENT, [probe])
    except CmdcError as exc:
        fail(f"the append after recovery failed: {exc!r}")
        return failures, counts
    after, torn_after, _ = raw_lines(journal)
    messages_after = [line for line in after if line.kind == "message"]
    if torn_after or messages_after[-1].record.message.id != probe.id or result.first_seq <= max(seqs, default=0):
        fail("recovery did not move the torn tail aside and append after the last record")
    ledger.address[probe.id] = result.first_seq
    ledger.intended.add(probe.id)
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
            "records": len(ledger.address),
            "checkpoints": ledger.checkpoints,
            "commits": ledger.commits,
            "abandoned": len(ledger.abandoned),
            "between_attempt_and_commit": totals["between_attempt_and_commit"],
            "torn_tails": totals["torn"],
            "newer_checkpoint": totals["newer_checkpoint"],
            "temp_files": totals["temp_files"],
            "seconds": elapsed,
        }
    for failure in failures[:20]:
        out(f"FAILED {failure}")
    out(
        f"crash test: {figures['kills']} SIGKILLs, {len(failures)} failures; "
        f"{figures['records']:,} acknowledged journal records, each read once at its number; "
        f"{figures['checkpoints']:,} acknowledged checkpoints, the last (or a newer) one loaded after every kill; "
        f"{figures['commits']:,} commits, {figures['abandoned']} abandoned attempts never seen; "
        f"{figures['between_attempt_and_commit']} kills between an attempt and its commit; "
        f"{figures['torn_tails']} torn tails moved aside by recovery; "
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

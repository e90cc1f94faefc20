"""Stopping at any moment: a process killed by SIGKILL (benchmarks/crash_test.py, small N here),
and a compaction or a turn cancelled at every checkpoint inside it.

The cancellation sweep steps through the target task with a trio Instrument: run k cancels the
scope just before the task's k-th step, for k = 1, 2, ... until a run finishes uncancelled.
Every time: the state is the old one or a committed new one, the journal parses with whole
records only (the batch entirely or not at all), no task is left behind, and every worker
thread job that started has finished.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from fakes import Adder, add, check_pairs
from faultfs import journal_lines, summary_ranges

from benchmarks import crash_test
from cmdc import (
    AfterCompact,
    BeforeCompact,
    Compacted,
    Compactor,
    ExtractiveSummarizer,
    Message,
    OffloadStore,
    Plugin,
    State,
    ToolCall,
    open_runtime,
)
from cmdc.checkpoint import CheckpointStore
from cmdc.errors import TurnAborted

AGENT = "a1"

# -- SIGKILL --------------------------------------------------------------------------------------


def test_crash_test_small(tmp_path: Path) -> None:
    lines: list[str] = []
    figures = crash_test.run(8, seed=11, max_delay=0.2, directory=tmp_path, out=lines.append)
    assert figures["failures"] == [], lines
    assert figures["kills"] == 8
    assert figures["records"] > 0 and figures["checkpoints"] > 0
    assert lines[-1].startswith("crash test: 8 SIGKILLs, 0 failures")


def test_crash_checker_is_not_vacuous(tmp_path: Path) -> None:
    """The same checks, after damage a crash must never cause, do fail."""
    figures = crash_test.run(3, seed=3, max_delay=0.2, directory=tmp_path, out=lambda _: None)
    assert figures["failures"] == []
    journal = tmp_path / "offload" / f"{crash_test.AGENT}.jsonl"
    records = trio.run(OffloadStore(tmp_path / "offload").records, crash_test.AGENT)
    assert records

    def ledger() -> crash_test.Ledger:
        led = crash_test.Ledger()
        led.address = {r.message.id: r.seq for r in records}
        led.evicted = led.intended = {r.message.id for r in records}
        return led

    data = journal.read_bytes()
    lines = data.split(b"\n")
    # a committed record is gone
    victim = next(i for i, line in enumerate(lines) if records[0].message.id.encode() in line)
    journal.write_bytes(b"\n".join(lines[:victim] + lines[victim + 1 :]))
    failures, _ = crash_test.check(tmp_path, ledger(), 98)
    assert any("misses a message" in f for f in failures), failures
    # a record moved to another number
    journal.write_bytes(data)
    led = ledger()
    led.address[records[-1].message.id] += 1000
    failures, _ = crash_test.check(tmp_path, led, 99)
    assert any("another record number" in f for f in failures), failures
    # a message the ledger never saw intended (an abandoned attempt's) is visible
    led = ledger()
    led.intended = led.intended - {records[0].message.id}
    failures, _ = crash_test.check(tmp_path, led, 100)
    assert any("abandoned attempts are visible" in f for f in failures), failures


# -- the cancellation sweep ------------------------------------------------------------------------


class Stepper(trio.abc.Instrument):
    """Counts the steps of one task and calls `at_step()` just before its k-th; tracks every
    task alive."""

    def __init__(self) -> None:
        self.alive: set[trio.lowlevel.Task] = set()
        self.task: trio.lowlevel.Task | None = None
        self.steps = 0
        self.k = 0
        self.at_step: Callable[[], None] = lambda: None

    def arm(self, task: trio.lowlevel.Task, k: int, at_step: Callable[[], None]) -> None:
        self.task, self.steps, self.k, self.at_step = task, 0, k, at_step

    def disarm(self) -> None:
        self.task = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.k:
                self.at_step()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.alive.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.alive.discard(task)


class Jobs:
    """Counts worker-thread jobs (`trio.to_thread.run_sync`) as they start and finish, in the
    worker threads themselves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = self.finished = 0
        self._lock = threading.Lock()
        real = trio.to_thread.run_sync

        async def run_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            def job(*a: Any) -> Any:
                with self._lock:
                    self.started += 1
                try:
                    return fn(*a)
                finally:
                    with self._lock:
                        self.finished += 1

            return await real(job, *args, **kwargs)

        monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)

    @property
    def running(self) -> int:
        with self._lock:
            return self.started - self.finished


@pytest.fixture
async def stepper() -> Any:
    instrument = Stepper()
    trio.lowlevel.add_instrument(instrument)
    yield instrument
    trio.lowlevel.remove_instrument(instrument)


class Checkpoints(Plugin):
    """before/after_compact hooks that yield to the scheduler: more points to cancel at."""

    async def before_compact(self, ctx: BeforeCompact) -> None:
        await trio.lowlevel.checkpoint()

    async def after_compact(self, ctx: AfterCompact) -> None:
        await trio.lowlevel.checkpoint()


async def slow_summarizer(messages: Sequence[Message], instruction: str) -> str:
    for _ in range(3):
        await trio.lowlevel.checkpoint()
    return await ExtractiveSummarizer()(messages, instruction)


def conversation(offload: Path, rounds: int, **config: Any) -> State:
    state = State(
        agent_id=AGENT,
        messages=(Message.system("You are terse."),),
        config={"compact_offload_dir": str(offload), "compact_keep": ("messages", 3), **config},
    )
    for r in range(rounds):
        call = ToolCall(id=f"r{r}", name="add", arguments={"a": r, "b": 1})
        state = state.append(
            Message.user(f"what is {r} + 1? " + "x" * 300),
            Message.assistant("", tool_calls=(call,)),
            Message.tool_result(call.id, str(r + 1)),
            Message.assistant(f"{r + 1}"),
        )
    return state


def check_journal(directory: Path) -> list[tuple[int, str]]:
    lines, torn = journal_lines(directory / f"{AGENT}.jsonl")
    assert not torn, "a cancelled append left a torn record"
    assert [s for s, _ in lines] == list(range(1, len(lines) + 1))
    return lines


async def test_cancel_force_compact_at_every_step(
    tmp_path: Path, stepper: Stepper, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = Jobs(monkeypatch)
    baseline = set(stepper.alive)
    cancelled = {"before the append": 0, "after the append": 0}
    for k in range(1, 10_000):
        offload = tmp_path / f"k{k}"
        old = conversation(offload, 6)
        old_json = old.to_json()
        compactor = Compactor(slow_summarizer, plugins=[Checkpoints()], retries=0)
        outcome: list[Any] = []

        async def target(k: int, compactor: Compactor, old: State, outcome: list[Any]) -> None:
            with trio.CancelScope() as scope:
                stepper.arm(trio.lowlevel.current_task(), k, scope.cancel)
                outcome.append(await compactor.force_compact(old))
            stepper.disarm()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(target, k, compactor, old, outcome)
        assert jobs.running == 0, f"k={k}: a worker thread is still running a job"
        assert stepper.alive == baseline, f"k={k}: a task was left behind"
        assert old.to_json() == old_json
        lines = check_journal(offload)
        if not outcome:  # cancelled: the journal holds the whole batch or nothing
            reference = await Compactor(retries=0).force_compact(conversation(tmp_path / "ref", 6))
            assert isinstance(reference, Compacted)
            assert len(lines) in (0, reference.report.evicted)
            cancelled["after the append" if lines else "before the append"] += 1
            again = await Compactor(retries=0).force_compact(old)  # a retry completes it
            assert isinstance(again, Compacted)
            state = again.state
        else:
            assert isinstance(outcome[0], Compacted)
            state = outcome[0].state
        on_disk = {s for s, _ in check_journal(offload)}
        for first, last in summary_ranges(state.messages):
            assert set(range(first, last + 1)) <= on_disk
        read = {m.id for m in await OffloadStore(offload).read(AGENT)}
        assert {m.id for m in old.messages} <= read | {m.id for m in state.messages}
        check_pairs(state.messages, state.messages)
        if outcome:
            break
    print("compact sweep:", cancelled)
    assert cancelled["before the append"] >= 1 and cancelled["after the append"] >= 5, cancelled


async def test_cancel_turn_at_every_step(tmp_path: Path, stepper: Stepper, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn that compacts before its request (and again after its tool step), cancelled at
    every step of the agent's task: by `abort()` once the turn runs, by the caller's scope
    before."""
    jobs = Jobs(monkeypatch)
    baseline = set(stepper.alive)
    cancelled: dict[str, int] = {"old state, journal empty": 0, "old state, batch journaled": 0, "a new commit": 0}
    for k in range(1, 10_000):
        root = tmp_path / f"k{k}"
        old = conversation(root / "offload", 4, compact_trigger=("messages", 16))
        await CheckpointStore(root / "ckpt").save(old)
        finished: list[Message] = []
        async with open_runtime(checkpoint_dir=root / "ckpt", log_events=False) as rt:
            agent = await rt.spawn(
                AGENT, Adder(), tools=[add], plugins=[Checkpoints()], summarizer=slow_summarizer, resume=True
            )
            agent_task = next(t for t in stepper.alive if t.name == AGENT)
            agent_state_before = await agent.state()
            with trio.CancelScope() as caller:

                def cancel(scope: trio.CancelScope = caller, ref: Any = agent) -> None:
                    scope.cancel()
                    ref.abort()

                stepper.arm(agent_task, k, cancel)
                with contextlib.suppress(TurnAborted):
                    finished.append(await agent.prompt("what is 2 + 3?"))
            stepper.disarm()
            await agent.ping()  # the turn has wound down (a shielded commit may have been in flight)
            state = await agent.state()
            # The state is a committed one: the old one, or one the turn committed.
            assert await CheckpointStore(root / "ckpt").load(AGENT) == state
            lines = check_journal(root / "offload")
            check_pairs(state.messages, state.messages)
            assert state.messages[: len(old.messages)] == old.messages or state.compactions > old.compactions
            read = {m.id for m in await OffloadStore(root / "offload").read(AGENT)}
            assert {m.id for m in old.messages} <= read | {m.id for m in state.messages}, "a message was lost"
            for first, last in summary_ranges(state.messages):
                assert set(range(first, last + 1)) <= {s for s, _ in lines}
            if state.compactions == old.compactions:
                assert state.messages[: len(old.messages)] == old.messages
            if state is agent_state_before:
                outcome = "old state, batch journaled" if lines else "old state, journal empty"
            else:
                outcome = "a new commit"
            # The agent carries on.
            assert (await agent.prompt("what is 2 + 3?")).text == "answer: 5"
        assert jobs.running == 0, f"k={k}: a worker thread is still running a job"
        assert stepper.alive == baseline, f"k={k}: a task was left behind"
        if finished:
            assert finished[0].text == "answer: 5"
            break
        cancelled[outcome] += 1
    print("turn sweep:", cancelled)
    # Not vacuous: some cancels left the old state and some a new commit. Whether a cancel lands
    # before or after the batch reached the journal depends on when the worker thread finishes,
    # which a loaded machine shifts, so those two outcomes are counted together.
    old_state = cancelled["old state, journal empty"] + cancelled["old state, batch journaled"]
    assert old_state >= 1 and cancelled["a new commit"] >= 1 and sum(cancelled.values()) >= 10, cancelled

"""`cmdc.testing`, the fakes for users' tests: every example in its docstrings runs as written,
and each fake does what its docstring says (this file imports only public names)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import cmdc
import cmdc.providers
import cmdc.testing
from cmdc.events import EVENTS_DROPPED, Event
from cmdc.testing import RecordingSummarizer, SummarizerCall, conversation, drain

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def examples() -> list[tuple[str, str]]:
    """(where, code) for every Python block in `cmdc.testing`'s docstrings and those of the
    names it exports."""
    found = [("cmdc.testing", code) for code in _BLOCK.findall(cmdc.testing.__doc__ or "")]
    for name in cmdc.testing.__all__:
        doc = inspect.getdoc(getattr(cmdc.testing, name)) or ""
        found += [(name, code) for code in _BLOCK.findall(doc)]
    return found


def test_every_name_is_documented_and_the_fakes_have_examples() -> None:
    for name in cmdc.testing.__all__:
        assert inspect.getdoc(getattr(cmdc.testing, name)), f"cmdc.testing.{name} has no docstring"
    where = [w for w, _ in examples()]
    assert where.count("cmdc.testing") == 2  # an agent with a compaction; the simulated model
    assert {"RecordingSummarizer", "drain", "conversation"} <= set(where)


@pytest.mark.parametrize(("where", "code"), examples(), ids=[w for w, _ in examples()])
def test_the_examples_run(where: str, code: str, tmp_path: Path) -> None:
    """Each example in a fresh interpreter, in an empty directory it must leave empty."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{where}: {done.stderr}"
    assert list(tmp_path.iterdir()) == [], f"{where} left files behind"


def test_the_providers_are_the_same_classes() -> None:
    assert cmdc.testing.ScriptedProvider is cmdc.providers.ScriptedProvider
    assert cmdc.testing.SimulatedModel is cmdc.providers.SimulatedModel


async def test_the_recording_summarizer_records_and_answers_the_same() -> None:
    summarizer = RecordingSummarizer("fixed")
    first = [cmdc.Message.user("a"), cmdc.Message.assistant("b")]
    batch = list(first)
    assert await summarizer(batch, "summarize") == "fixed"
    batch.append(cmdc.Message.user("added after the call"))  # the record is a copy
    assert await summarizer((), "again") == "fixed"
    assert summarizer.calls == [SummarizerCall(tuple(first), "summarize"), SummarizerCall((), "again")]
    assert summarizer.calls[0].messages == tuple(first) and summarizer.calls[1].instruction == "again"
    assert repr(summarizer) == "RecordingSummarizer(answer='fixed', calls=2)"
    assert await RecordingSummarizer()([], "") == "the summary"


async def test_a_recording_summarizer_is_cancellable() -> None:
    """It checkpoints, as a real summarizer awaits: a caller's cancellation reaches it."""
    summarizer = RecordingSummarizer()
    with trio.CancelScope() as scope:
        scope.cancel()
        await summarizer([], "")
        pytest.fail("not cancelled")
    assert scope.cancelled_caught and len(summarizer.calls) == 1


def event(kind: str) -> Event:
    return Event(kind, agent_id="a", data={}, time=0.0)


async def test_drain_takes_what_is_there_then_stops(tmp_path: Path) -> None:
    async with cmdc.open_runtime(store=tmp_path) as rt:
        agent = await rt.spawn("a", cmdc.testing.ScriptedProvider(["one", "two"]))
        with rt.subscribe("a", buffer=2) as sub:
            assert drain(sub) == []
            await agent.prompt("hi")  # turn_start, request, response, turn_end: two too many
            got = drain(sub)
            assert [e.kind for e in got] == [EVENTS_DROPPED, "response", "turn_end"]  # the overflow first
            assert got[0].data["count"] == 2 and drain(sub) == []
            await agent.prompt("again")
            sub.close()  # closed: what was buffered is discarded, and drain ends without raising
            assert drain(sub) == []


async def test_drain_reads_any_event_source() -> None:
    class Source:
        def __init__(self, *kinds: str) -> None:
            self.left = [event(k) for k in kinds]

        def receive_nowait(self) -> Event:
            if not self.left:
                raise trio.EndOfChannel
            return self.left.pop(0)

    assert [e.kind for e in drain(Source("x", "y"))] == ["x", "y"]


def test_conversation_is_deterministic_and_well_formed() -> None:
    a, b = conversation(40, seed=3), conversation(40, seed=3)
    assert [(m.role, m.text) for m in a] == [(m.role, m.text) for m in b]
    assert {m.id for m in a}.isdisjoint(m.id for m in b)  # new messages, new ids
    assert [m.text for m in conversation(40, seed=4)] != [m.text for m in a]
    assert a[0].role == "system" and conversation(40, system=False)[0].role == "user"
    assert all(m.usage is None for m in conversation(40, usage=False))
    for n in range(12):  # never ends inside a call group
        messages = conversation(n, seed=n)
        calls = {c.id for m in messages for c in m.tool_calls}
        assert len(messages) <= n and calls == {m.tool_call_id for m in messages if m.role == "tool"}

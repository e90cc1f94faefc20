"""The runtime's face as a newcomer meets it: the system prompt at spawn, resume made explicit,
subscriptions that end with their agent, errors that leave `open_runtime` unwrapped, manual
compaction answering like the Compactor, and the user's question never summarized away."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from cmdc import (
    AfterCompact,
    AgentNotFound,
    CompactionReport,
    ConfigError,
    ContextOverflow,
    InvalidMessage,
    Message,
    Plugin,
    State,
    open_runtime,
)
from cmdc.providers import ModelRequest
from cmdc.testing import drain


class Echo:
    """Answers every request with the last user text; records what it was sent."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> Message:
        self.requests.append(request)
        last = next(m for m in reversed(request.messages) if m.role == "user" and not m.is_summary)
        return Message.assistant(f"re: {last.text[:40]}")


def cfg(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path / "offload"), **extra}


# -- the system prompt ----------------------------------------------------------------------------


async def test_instructions_are_the_system_prompt(tmp_path: Path) -> None:
    model = Echo()
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", model, instructions="You are terse.", config=cfg(tmp_path))
        first = (await agent.state()).messages
        assert [(m.role, m.text) for m in first] == [("system", "You are terse.")]
        await agent.prompt("hello")
        sent = model.requests[0].messages
        assert sent[0].role == "system" and sent[0].text == "You are terse." and sent[1].text == "hello"


@pytest.mark.parametrize("bad", ["", "   ", 42, b"bytes"])
async def test_instructions_must_be_text(tmp_path: Path, bad: object) -> None:
    async with open_runtime(log_events=False) as rt:
        with pytest.raises(ConfigError, match="instructions"):
            await rt.spawn("a1", Echo(), instructions=bad, config=cfg(tmp_path))  # type: ignore[arg-type]
        assert rt.whereis("a1") is None


async def test_a_system_message_mid_conversation_is_refused(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        free = await rt.spawn("free", Echo(), config=cfg(tmp_path))
        # leading system messages in the very first prompt are still the system prompt
        await free.prompt([Message.system("Be brief."), Message.user("hi")])
        before = await free.state()
        with pytest.raises(InvalidMessage, match="instructions"):
            await free.prompt([Message.system("New rules."), Message.user("hi again")])
        with pytest.raises(InvalidMessage, match="system message"):
            await free.send(Message.system("sneaky"))
        with pytest.raises(InvalidMessage):
            free.send_nowait([Message.user("ok"), Message.system("sneaky")])
        assert free.running and await free.state() == before

        told = await rt.spawn("told", Echo(), instructions="You are terse.", config=cfg(tmp_path))
        await told.prompt("hi")
        with pytest.raises(InvalidMessage):
            await told.prompt(Message.system("second"))
        assert [m.role for m in (await told.state()).messages] == ["system", "user", "assistant"]


# -- resume ---------------------------------------------------------------------------------------


async def test_resume_unknown_names_and_config_merge(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    async with open_runtime(checkpoint_dir=ckpt, log_events=False) as rt:
        with pytest.raises(AgentNotFound, match="no checkpoint"):
            await rt.spawn("ghost", Echo(), resume="require", config=cfg(tmp_path))
        fresh = await rt.spawn("fresh", Echo(), resume=True, config=cfg(tmp_path))  # documented: starts fresh
        assert (await fresh.state()).messages == ()
        with pytest.raises(ConfigError, match="resume"):
            await rt.spawn("bad", Echo(), resume="yes", config=cfg(tmp_path))  # type: ignore[arg-type]
        keeper = await rt.spawn(
            "keeper", Echo(), instructions="Old prompt.", config=cfg(tmp_path, compact_keep=("messages", 3))
        )
        await keeper.prompt("remember me")
    async with open_runtime(checkpoint_dir=ckpt, log_events=False) as rt:
        again = await rt.spawn(
            "keeper", Echo(), resume="require", instructions="New prompt.", config={"compact_trigger": ("messages", 50)}
        )
        state = await again.state()
        assert state.config["compact_keep"] == ("messages", 3)  # kept from the checkpoint
        assert state.config["compact_trigger"] == ("messages", 50)  # the given key wins
        assert state.config["compact_offload_dir"] == str(tmp_path / "offload")
        assert [(m.role, m.text) for m in state.messages] == [
            ("system", "New prompt."),
            ("user", "remember me"),
            ("assistant", "re: remember me"),
        ]


async def test_resume_needs_a_checkpoint_dir(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        with pytest.raises(ConfigError, match="checkpoint_dir"):
            await rt.spawn("a", Echo(), resume="require", config=cfg(tmp_path))


# -- subscriptions, errors, state -----------------------------------------------------------------


async def test_a_subscription_ends_when_its_agent_stops(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", Echo(), config=cfg(tmp_path))
        with rt.subscribe("a1") as sub, rt.subscribe() as everything:
            await agent.prompt("hi")
            await agent.stop()
            kinds = [e.kind async for e in sub]  # finishes: no hang after stop()
            assert kinds[0] == "turn_start" and kinds[-1] == "stopped"
            assert not everything.closed  # the all-agents subscription goes on
            last = drain(everything)[-1]
            assert last.kind == "stopped" and last.data["reason"] == "stopped"
        # the name spawned again: a new subscription follows the new agent
        again = await rt.spawn("a1", Echo(), config=cfg(tmp_path))
        with rt.subscribe("a1") as sub:
            await again.prompt("hi")
            assert (await sub.receive()).kind == "turn_start"


async def test_open_runtime_raises_a_single_error_unwrapped() -> None:
    with pytest.raises(KeyError) as info:
        async with open_runtime(log_events=False):
            raise KeyError("mine")
    assert not isinstance(info.value, BaseExceptionGroup)
    # a group the block raised itself stays that group
    with pytest.raises(ExceptionGroup) as group:
        async with open_runtime(log_events=False):
            raise ExceptionGroup("two", [ValueError(1), ValueError(2)])
    assert group.value.message == "two"


async def test_state_is_a_checkpoint(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", Echo(), config=cfg(tmp_path))
        with trio.testing.assert_checkpoints():
            await agent.state()


# -- compaction from the agent's side -------------------------------------------------------------


class Note(Plugin):
    def __init__(self, how: str) -> None:
        self.how = how

    async def after_compact(self, ctx: AfterCompact) -> State:
        note = Message.user("[skills reloaded]")
        return ctx.insert_after_summary(note) if self.how == "insert" else ctx.state.append(note)


@pytest.mark.parametrize("how", ["insert", "append"])
async def test_context_added_after_a_compaction(tmp_path: Path, how: str) -> None:
    model = Echo()
    config = cfg(tmp_path, compact_trigger=("messages", 6), compact_keep=("messages", 2))
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", model, instructions="sys", plugins=[Note(how)], config=config)
        for i in range(4):
            await agent.prompt(f"question {i}: " + "with enough words to be worth summarizing " * 5)
    # the request right after the compaction
    sent = next(r.messages for r in model.requests if any(m.is_summary for m in r.messages))
    summary = next(i for i, m in enumerate(sent) if m.is_summary)
    note = next(i for i, m in enumerate(sent) if m.text == "[skills reloaded]")
    question = max(i for i, m in enumerate(sent) if m.text.startswith("question"))
    if how == "insert":  # the supported way: right after the summary, the question stays last
        assert note == summary + 1 and question == len(sent) - 1
    else:  # append means append: after the question (documented; the model reads it last)
        assert question < note and sent[-1].text == "[skills reloaded]"


async def test_the_users_question_is_never_summarized_away(tmp_path: Path) -> None:
    """A question larger than what compaction keeps: kept whole (after the summary), and a
    note appended by a plugin cannot push it out; too large for the model, the caller gets
    ContextOverflow, not an answer to a summary of it."""
    seen: list[tuple[Message, ...]] = []

    async def model(request: ModelRequest) -> Message:
        seen.append(request.messages)
        return Message.assistant("ok")

    class Model:
        async def complete(self, request: ModelRequest) -> Message:
            return await model(request)

    big = "word " * 20_000  # ~25k tokens
    config = cfg(tmp_path, compact_trigger=("tokens", 3_000), compact_keep=("tokens", 500))
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", Model(), plugins=[Note("append")], config=config)
        for i in range(3):
            await agent.prompt(f"small {i} " * 200)
        await agent.prompt(big)
        sent = seen[-1]
        assert any(m.text == big for m in sent), "the question was summarized away"
        assert any(m.is_summary for m in sent)

        class Tight:
            async def complete(self, request: ModelRequest) -> Message:
                if sum(len(m.text) for m in request.messages) > 40_000:
                    raise ContextOverflow("prompt too long", prompt_tokens=30_000, limit=8_000)
                return Message.assistant("ok")

        tight = await rt.spawn("a2", Tight(), config=config)
        await tight.prompt("hello")
        with pytest.raises(ContextOverflow):
            await tight.prompt(big)
        assert all(m.text != big for m in (await tight.state()).messages)  # nothing half-committed


def test_insert_after_summary_places_and_refuses() -> None:
    summary = Message.user("summary", metadata={"cmdc.kind": "summary"})
    state = State(agent_id="a", messages=(Message.system("s"), Message.user("task"), summary, Message.user("q")))
    note = Message.user("note")
    out = state.insert_after_summary(note)
    assert [m.text for m in out.messages] == ["s", "task", "summary", "note", "q"]
    assert out.token_usage > state.token_usage
    plain = State(agent_id="a", messages=(Message.system("s"), Message.user("q")))
    assert [m.text for m in plain.insert_after_summary(note).messages] == ["s", "note", "q"]
    assert state.insert_after_summary() is state
    for bad in (Message.system("x"), Message.tool_result("c1", "x")):
        with pytest.raises(InvalidMessage):
            state.insert_after_summary(bad)
    with pytest.raises(InvalidMessage):
        state.insert_after_summary("text")  # type: ignore[arg-type]


def test_report_is_importable_from_everywhere_it_was() -> None:
    from cmdc import CompactionReport as C
    from cmdc.compaction import CompactionReport as A
    from cmdc.compaction.compactor import CompactionReport as B

    assert A is B is C is CompactionReport


async def test_a_fraction_takes_the_window_the_provider_knows(tmp_path: Path) -> None:
    from cmdc.providers import SimulatedModel

    fraction = cfg(tmp_path, compact_trigger=[("messages", 400), ("fraction", 0.5)])
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", SimulatedModel(context_window=6_000), config=fraction)
        assert (await agent.state()).config["context_window"] == 6_000
        mine = await rt.spawn("a2", SimulatedModel(context_window=6_000), config={**fraction, "context_window": 9_000})
        assert (await mine.state()).config["context_window"] == 9_000  # an explicit window wins
        plain = await rt.spawn("a3", SimulatedModel(context_window=6_000), config=cfg(tmp_path))
        assert (await plain.state()).config["context_window"] == 6_000  # the default trigger is 0.85 of it
        tokens = cfg(tmp_path, compact_trigger=("tokens", 5_000))
        fixed = await rt.spawn("a5", SimulatedModel(context_window=6_000), config=tokens)
        assert "context_window" not in (await fixed.state()).config  # not needed: not added
        with pytest.raises(ConfigError, match="context_window"):  # a provider that does not know
            await rt.spawn("a4", Echo(), config=cfg(tmp_path, compact_keep=("fraction", 0.2)))


def test_the_spawn_keywords_are_the_agent_options() -> None:
    """`SpawnOptions` (what a type checker knows of spawn's keywords) lists every `AgentOptions`
    field with its type, and nothing else."""
    import typing

    import attrs

    from cmdc import AgentOptions, SpawnOptions

    assert list(typing.get_type_hints(SpawnOptions)) == [f.name for f in attrs.fields(AgentOptions)]
    assert typing.get_type_hints(SpawnOptions) == typing.get_type_hints(AgentOptions)
    assert SpawnOptions.__required_keys__ == frozenset()


@pytest.mark.parametrize(
    ("options", "keywords", "said"),
    [
        (None, {"max_step": 5}, "unknown spawn option(s) ['max_step'] (did you mean 'max_steps'?)"),
        (None, {"max_steps": 0}, "max_steps"),
        (None, {"restart": "sometimes"}, "restart"),
        ({"max_steps": 5}, {}, "options must be an AgentOptions value"),
        ("fast", {"max_steps": 5}, "options must be an AgentOptions value"),
    ],
)
async def test_bad_spawn_options_are_refused_by_name(
    tmp_path: Path, options: object, keywords: dict[str, Any], said: str
) -> None:
    async with open_runtime() as rt:
        with pytest.raises(ConfigError, match=re.escape(said)):
            await rt.spawn("a", Echo(), config=cfg(tmp_path), options=options, **keywords)  # type: ignore[arg-type]
        assert rt.agents == []


async def test_options_and_keywords_together(tmp_path: Path) -> None:
    """The keywords win over the `options` value; each call form gives the same options."""
    from cmdc import AgentOptions

    async with open_runtime() as rt:
        a = await rt.spawn("a", Echo(), config=cfg(tmp_path), options=AgentOptions(max_steps=4, max_queued=9))
        b = await rt.spawn("b", Echo(), config=cfg(tmp_path), options=AgentOptions(max_steps=4), max_queued=9)
        c = await rt.spawn("c", Echo(), config=cfg(tmp_path), max_steps=4, max_queued=9)
        d = await rt.spawn("d", Echo(), config=cfg(tmp_path), options=AgentOptions(max_steps=2), max_steps=4)
        seen = [rt.observe(r.name) for r in (a, b, c)]
        assert all(agent is not None and agent.options == AgentOptions(max_steps=4, max_queued=9) for agent in seen)
        agent = rt.observe(d.name)
        assert agent is not None and agent.options.max_steps == 4

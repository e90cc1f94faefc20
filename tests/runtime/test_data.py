"""Messages, State, token accounting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cmdc
from cmdc import ConfigError, ImagePart, InvalidMessage, Message, State, TokenUsage, ToolCall
from cmdc import tokens as tokens_mod
from cmdc.testing import conversation


def test_ids_are_unique_and_messages_frozen() -> None:
    a, b = Message.user("x"), Message.user("x")
    assert a.id != b.id and a != b
    with pytest.raises(AttributeError):
        a.content = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.metadata["k"] = 1  # type: ignore[index]


def test_contract_constructors() -> None:
    call = ToolCall(id="c1", name="search", arguments={"q": "x", "opts": [1, {"a": 2}]})
    asst = Message.assistant("t", tool_calls=(call,), usage=TokenUsage(input_tokens=3, output_tokens=2))
    assert asst.role == "assistant" and asst.tool_calls == (call,) and asst.usage.total_tokens == 5
    res = Message.tool_result("c1", "ok", is_error=True)
    assert res.role == "tool" and res.tool_call_id == "c1" and res.is_error
    assert Message.system("s").role == "system"
    with pytest.raises(TypeError):
        call.arguments["opts"][1]["a"] = 3  # type: ignore[index]


@pytest.mark.parametrize(
    "build",
    [
        lambda: Message("robot", "x"),  # type: ignore[arg-type]
        lambda: Message("user", "x", tool_calls=(ToolCall(id="c", name="n"),)),
        lambda: Message("tool", "x"),
        lambda: Message.user(3),  # type: ignore[arg-type]
        lambda: Message.user("bad \ud800 surrogate"),
        lambda: Message.assistant(tool_calls=(ToolCall(id="c", name="n"), ToolCall(id="c", name="m"))),
        lambda: ToolCall(id="", name="n"),
        lambda: ToolCall(id="c", name="n", arguments={"x": object()}),
        lambda: Message.user("x", metadata={1: 2}),  # type: ignore[dict-item]
        lambda: TokenUsage(input_tokens=-1),
        lambda: TokenUsage(input_tokens=True),
    ],
)
def test_malformed_messages_raise_invalid_message(build: object) -> None:
    with pytest.raises(InvalidMessage):
        build()  # type: ignore[operator]


def test_parts_and_image_cost() -> None:
    m = Message.user(["look at this", ImagePart("https://x/img.png", "image/png")])
    assert m.text.startswith("look at this")
    assert tokens_mod.estimate_message_tokens(m) == (
        tokens_mod.estimate_text_tokens("look at this") + tokens_mod.IMAGE_TOKENS + tokens_mod.MESSAGE_OVERHEAD
    )
    assert Message.from_json(m.to_json()) == m


def test_estimate_counts_bytes_and_tool_calls() -> None:
    assert tokens_mod.estimate_text_tokens("abcd") == 1
    assert tokens_mod.estimate_text_tokens("abcde") == 2
    assert tokens_mod.estimate_text_tokens("é" * 4) == 2  # 8 UTF-8 bytes
    plain = Message.assistant("")
    with_call = Message.assistant("", tool_calls=(ToolCall(id="c", name="search", arguments={"q": "x" * 40}),))
    assert tokens_mod.estimate_message_tokens(with_call) > tokens_mod.estimate_message_tokens(plain) + 10


def test_state_round_trip_with_config_tuples() -> None:
    msgs = conversation(40, seed=3)
    config = {
        "compact_trigger": [("tokens", 100), ("messages", 30)],
        "compact_keep": ("messages", 4),
        "context_window": 1000,
        "x-nested": {"a": [1, 2.5, None, True]},
    }
    state = State(agent_id="a1", messages=msgs, config=config, compactions=2)
    again = State.from_json(state.to_json())
    assert again == state
    assert again.config["compact_trigger"] == (("tokens", 100), ("messages", 30))
    assert again.token_usage == state.token_usage
    with pytest.raises(TypeError):
        state.config["x"] = 1  # type: ignore[index]


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b"[]",
        b'{"agent_id": "../x"}',
        b'{"agent_id": "a", "messages": 3}',
        b'{"agent_id": "a", "messages": [{"role": "user"}]}',
        b'{"agent_id": "a", "compactions": -1}',
    ],
)
def test_state_from_bad_json(bad: bytes) -> None:
    with pytest.raises(cmdc.CmdcError):
        State.from_json(bad)


@pytest.mark.parametrize("config", [{"x": object()}, {"x": float("nan")}, {1: 2}, {"x": 2**70}])
def test_state_config_must_be_json(config: dict[object, object]) -> None:
    with pytest.raises(ConfigError):
        State(agent_id="a", config=config)  # type: ignore[arg-type]


@pytest.mark.parametrize("agent_id", ["../x", "a/b", "", "a\x00b", ".", "..", "x" * 200, ".hidden", 5])
def test_state_refuses_hostile_ids(agent_id: object) -> None:
    with pytest.raises(ConfigError):
        State(agent_id=agent_id)  # type: ignore[arg-type]


def test_usage_baseline_and_incremental_figure() -> None:
    s = State(agent_id="a", messages=[Message.user("hi")])
    assert s.token_usage == tokens_mod.estimate_message_tokens(s.messages[0])
    reply = Message.assistant("ok", usage=TokenUsage(input_tokens=10_000, output_tokens=1))
    s = s.append(reply)
    assert s.token_usage == 10_001 and s.last_usage == reply.usage
    extra = Message.tool_result("c", "x" * 40)
    s2 = s.append(extra)
    assert s2.token_usage == 10_001 + tokens_mod.estimate_message_tokens(extra)
    # Built directly, the figure is the same as built by appends.
    assert State(agent_id="a", messages=s2.messages).token_usage == s2.token_usage


def test_usage_floor_ignores_stale_usage() -> None:
    reply = Message.assistant("ok", usage=TokenUsage(input_tokens=50_000, output_tokens=1))
    s = State(agent_id="a", messages=[Message.user("hi"), reply], usage_floor=2)
    assert s.token_usage == tokens_mod.estimate_tokens_from_messages(s.messages)
    assert s.last_usage is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "asst", "asst_usage", "tool"]), st.text(max_size=50), st.integers(0, 10**6)),
        max_size=30,
    )
)
def test_append_matches_direct_construction(ops: list[tuple[str, str, int]]) -> None:
    s = State(agent_id="p")
    for kind, text, n in ops:
        if kind == "user":
            m = Message.user(text)
        elif kind == "asst":
            m = Message.assistant(text)
        elif kind == "asst_usage":
            m = Message.assistant(text, usage=TokenUsage(input_tokens=n, output_tokens=1))
        else:
            m = Message.tool_result("c1", text)
        s = s.append(m)
    assert s.token_usage == State(agent_id="p", messages=s.messages).token_usage
    assert State.from_json(s.to_json()) == s


def test_evolved_metadata_keeps_the_frozen_values_it_reuses_and_checks_the_new_ones() -> None:
    """`evolve(metadata={**m.metadata, ...})` (a summary tagged, rebuilt) reuses the values taken
    from `m` as they are (frozen once, when `m` was made) and freezes and checks only the new
    ones: the result is the same read-only value as a message made from scratch."""
    big = {"entries": [["value", f"k{i}", "text", i, 1, ""] for i in range(200)], "v": 1}
    m = Message.user("s", metadata={"cmdc.ledger": big, "n": 1})
    tagged = m.evolve(metadata={**m.metadata, "cmdc.attempts": ["k0123456789abcdef"]})
    assert tagged.metadata["cmdc.ledger"] is m.metadata["cmdc.ledger"]  # not frozen again
    assert tagged.metadata["cmdc.attempts"] == ("k0123456789abcdef",)
    fresh = Message.user("s", metadata={"cmdc.ledger": big, "n": 1, "cmdc.attempts": ["k0123456789abcdef"]})
    assert tagged.metadata == fresh.metadata and tagged.to_dict()["metadata"] == fresh.to_dict()["metadata"]
    with pytest.raises(TypeError):
        tagged.metadata["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        tagged.metadata["cmdc.attempts"][0] = "x"  # type: ignore[index]
    # the new values are checked as ever
    for bad in ({"x": float("nan")}, {"x": object()}, {"x": {1: 2}}):
        with pytest.raises(InvalidMessage):
            m.evolve(metadata={**m.metadata, **bad})
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    with pytest.raises(InvalidMessage, match="nested"):
        m.evolve(metadata={**m.metadata, "deep": deep})

    class Key(str):
        pass

    with pytest.raises(InvalidMessage, match="not a string"):  # a reused value under a key of another type
        m.evolve(metadata={Key("n"): m.metadata["n"], "cmdc.ledger": m.metadata["cmdc.ledger"]})
    # a value that only equals the old one (a plain list) is frozen, not taken as it is
    again = m.evolve(metadata={"cmdc.ledger": big})
    assert again.metadata["cmdc.ledger"] == m.metadata["cmdc.ledger"]
    assert isinstance(again.metadata["cmdc.ledger"]["entries"], tuple)
    assert m.evolve(metadata={}).metadata == {}

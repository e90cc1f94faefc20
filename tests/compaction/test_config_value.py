"""`state.config` as a `CompactConfig` value: `State(config=CompactConfig(...))` holds its keys
(only what differs from the defaults), the JSON round trip stays lossless, the dict form is
unchanged, and every field is checked when built, naming its `state.config` key and value."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cmdc import CompactConfig, Compactor, ConfigError, Message, State, open_runtime
from cmdc.compaction import Threshold, TierConfig
from cmdc.compaction.config import DEFAULT_TRIGGER, DEFAULT_WINDOW_FRACTION
from cmdc.providers import ScriptedProvider


def test_a_config_value_is_held_as_its_keys() -> None:
    cc = CompactConfig(
        context_window=100_000,
        triggers=(Threshold("tokens", 50_000), Threshold("messages", 400)),
        keep=("messages", 4),
        offload_dir="/var/lib/agents",
        tiers=TierConfig(mask_keep=5, mask_exclude=["read_file", "bash"], tool_result_limits={"bash": None}),
    )
    state = State(agent_id="a1", config=cc)
    assert dict(state.config) == {
        "context_window": 100_000,
        "compact_trigger": (("tokens", 50_000), ("messages", 400)),
        "compact_keep": ("messages", 4),
        "compact_offload_dir": "/var/lib/agents",
        "tool_result_limits": {"bash": None},
        "mask_keep": 5,
        "mask_exclude": ("bash", "read_file"),
    }
    assert CompactConfig.from_mapping(state.config) == cc
    assert Compactor().compact_config(state) == cc
    again = State.from_json(state.to_json())
    assert again == state and again.config == state.config
    assert again.config["compact_keep"] == ("messages", 4)  # tuples stay tuples
    assert state.evolve(config=CompactConfig()).config == {}


def test_defaults_are_left_out_so_the_window_still_sets_the_trigger() -> None:
    assert CompactConfig().as_config() == {}
    assert CompactConfig().triggers == (Threshold(*DEFAULT_TRIGGER),)
    windowed = CompactConfig(context_window=64_000)
    assert windowed.triggers == (Threshold("fraction", DEFAULT_WINDOW_FRACTION),)
    assert windowed.as_config() == {"context_window": 64_000}
    assert CompactConfig.from_mapping({"context_window": 64_000}) == windowed


def test_user_keys_go_beside_the_keys_of_a_value() -> None:
    cc = CompactConfig(keep=Threshold("tokens", 2_000))
    state = State(agent_id="a1", config={**cc.as_config(), "x-app": {"user": 7}})
    assert state.config["x-app"] == {"user": 7}
    assert CompactConfig.from_mapping(state.config) == cc


async def test_a_compactor_follows_the_value(tmp_path: Path) -> None:
    cc = CompactConfig(triggers=("messages", 8), keep=("messages", 2), offload_dir=tmp_path)
    state = State(agent_id="v1", messages=tuple(Message.user(f"m{i} " * 30) for i in range(8)), config=cc)
    compactor = Compactor()
    assert compactor.should_compact(state)
    result = await compactor.maybe_compact(state)
    kept = result.state.messages
    assert kept[0] == state.messages[0] and kept[1].is_summary and kept[2:] == state.messages[-2:]  # task, summary, 2
    assert (tmp_path / "v1.jsonl").exists()


def test_a_fraction_waits_for_its_window_as_in_the_dict_form() -> None:
    cc = CompactConfig(keep=("fraction", 0.25))  # a State takes it: the runtime fills the window in
    state = State(agent_id="a1", config=cc)
    with pytest.raises(ConfigError, match=r"compact_keep.*context_window"):
        Compactor().compact_config(state)
    assert Compactor().compact_config(state.evolve(config={**state.config, "context_window": 8_000})).keep == cc.keep


BAD: list[tuple[str, str, Any, str]] = [  # field, its key, the value, what the error shows of it
    ("context_window", "context_window", 0, "0"),
    ("context_window", "context_window", -5, "-5"),
    ("context_window", "context_window", True, "True"),
    ("context_window", "context_window", 1.5, "1.5"),
    ("context_window", "context_window", "128k", "128k"),
    ("triggers", "compact_trigger", ("tokens", 0), "0"),
    ("triggers", "compact_trigger", ("fraction", 1.5), "1.5"),
    ("triggers", "compact_trigger", ("fraction", 1), "1"),
    ("triggers", "compact_trigger", ("weeks", 3), "weeks"),
    ("triggers", "compact_trigger", Threshold("tokens", math.inf), "inf"),
    ("triggers", "compact_trigger", "tokens", "tokens"),
    ("triggers", "compact_trigger", (), "empty"),
    ("triggers", "compact_trigger", [("tokens", 5), "x"], "'x'"),
    ("keep", "compact_keep", ("messages", 2.0), "2.0"),
    ("keep", "compact_keep", ("tokens", True), "True"),
    ("keep", "compact_keep", Threshold("bogus", 3), "bogus"),
    ("keep", "compact_keep", ("messages", 2, 3), "('messages', 2, 3)"),
    ("keep", "compact_keep", None, "None"),
    ("offload_dir", "compact_offload_dir", "", "''"),
    ("offload_dir", "compact_offload_dir", "a\x00b", "a\\x00b"),
    ("offload_dir", "compact_offload_dir", 5, "5"),
    ("summary_prompt", "compact_summary_prompt", "", "''"),
    ("summary_prompt", "compact_summary_prompt", "   ", "'   '"),
    ("summary_prompt", "compact_summary_prompt", b"bytes", "b'bytes'"),
    ("tiers", "tiers", {"mask_keep": 1}, "{'mask_keep': 1}"),
]


@pytest.mark.parametrize(("field", "key", "value", "shown"), BAD)
def test_a_malformed_field_names_its_key_and_value(field: str, key: str, value: Any, shown: str) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        CompactConfig(**{field: value})
    assert shown in str(info.value)
    with pytest.raises(ConfigError, match=key):  # evolve checks again
        attrs.evolve(CompactConfig(), **{field: value})


TIER_BAD: list[tuple[str, str, Any]] = [
    ("tool_result_limit", "tool_result_limit", 0),
    ("tool_result_limit", "tool_result_limit", "8k"),
    ("tool_result_limits", "tool_result_limits", {"bash": 0}),
    ("tool_result_limits", "tool_result_limits", {"": 5}),
    ("tool_result_limits", "tool_result_limits", ["bash"]),
    ("tool_result_preview", "tool_result_preview", 3),
    ("mask_tool_results", "mask_tool_results", "yes"),
    ("mask_trigger", "mask_trigger", 0.0),
    ("mask_trigger", "mask_trigger", 2),
    ("mask_keep", "mask_keep", -1),
    ("mask_at_least", "mask_at_least", 0),
    ("mask_exclude", "mask_exclude", "bash"),
    ("mask_exclude", "mask_exclude", [""]),
    ("thrash", "compact_thrash", (0, 3)),
    ("thrash", "compact_thrash", "3,3"),
    ("min_gain", "compact_min_gain", -1),
]


@pytest.mark.parametrize(("field", "key", "value"), TIER_BAD)
def test_a_malformed_tier_field_names_its_key(field: str, key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        TierConfig(**{field: value})
    with pytest.raises(ConfigError, match=key):  # and the dict form, as before
        State(agent_id="a1", config={key: value})


def test_the_dict_form_is_unchanged() -> None:
    config = {"compact_trigger": ("tokens", 9_000), "compact_keep": ("messages", 3), "mask_keep": 1}
    state = State(agent_id="a1", config=config)
    assert dict(state.config) == config
    with pytest.raises(ConfigError, match="compact_keep"):
        State(agent_id="a1", config={"compact_keep": ("messages", 0)})
    with pytest.raises(ConfigError, match="compact_kep"):
        State(agent_id="a1", config={"compact_kep": ("messages", 3)})


counts = st.integers(min_value=1, max_value=10**9)
fractions = st.floats(min_value=1e-6, max_value=1.0, allow_nan=False)
rules = st.one_of(
    st.tuples(st.sampled_from(["tokens", "messages"]), counts),
    st.tuples(st.just("fraction"), fractions),
)
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
tiers = st.builds(
    TierConfig,
    tool_result_limit=st.none() | counts,
    tool_result_limits=st.dictionaries(names, st.none() | counts, max_size=3),
    tool_result_preview=st.integers(min_value=16, max_value=10_000),
    mask_tool_results=st.booleans(),
    mask_trigger=fractions,
    mask_keep=st.integers(min_value=0, max_value=50),
    mask_at_least=st.none() | counts,
    mask_exclude=st.frozensets(names, max_size=3),
    thrash=st.tuples(counts, counts),
    min_gain=st.none() | counts,
)
configs = st.builds(
    CompactConfig,
    context_window=st.none() | counts,
    triggers=st.lists(rules, min_size=1, max_size=3),
    keep=rules,
    offload_dir=st.sampled_from([".cmdc/conversation_history", "/tmp/x", "rel/dir"]),
    summary_prompt=st.text(min_size=1, max_size=40).filter(str.strip),
    tiers=tiers,
)


@given(configs)
def test_any_value_survives_the_state_and_its_json(cc: CompactConfig) -> None:
    state = State(agent_id="h1", config=cc)
    assert CompactConfig.from_mapping(state.config, need_window=False) == cc
    again = State.from_json(state.to_json())
    assert again == state and CompactConfig.from_mapping(again.config, need_window=False) == cc


async def test_spawn_takes_a_config_value_fresh_and_resumed(tmp_path: Path) -> None:
    cc = CompactConfig(keep=("messages", 3), offload_dir=tmp_path / "offload")
    async with open_runtime(checkpoint_dir=tmp_path / "ckpt", log_events=False) as rt:
        agent = await rt.spawn("cv", ScriptedProvider(["hello"]), config=cc)
        await agent.prompt("hi")
        state = await agent.state()
        assert CompactConfig.from_mapping(state.config) == cc
    async with open_runtime(checkpoint_dir=tmp_path / "ckpt", log_events=False) as rt:
        given = CompactConfig(triggers=("messages", 40))
        again = await rt.spawn("cv", ScriptedProvider([]), resume="require", config=given)
        resumed = CompactConfig.from_mapping((await again.state()).config)
        # its keys merged over the checkpoint's, as a mapping's are
        assert resumed.keep == cc.keep and resumed.triggers == (Threshold("messages", 40),)

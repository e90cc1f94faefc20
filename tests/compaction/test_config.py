"""CompactConfig: defaults, every valid form, every malformed form of every key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdc import CompactConfig, Compactor, ConfigError, State
from cmdc.compaction.config import DEFAULT_SUMMARY_PROMPT, Threshold


def test_defaults() -> None:
    c = CompactConfig.from_mapping({})
    assert c.triggers == (Threshold("tokens", 170_000),)
    assert c.keep == Threshold("messages", 6)
    assert c.offload_dir == Path(".cmdc/conversation_history")
    assert c.summary_prompt == DEFAULT_SUMMARY_PROMPT
    assert c.context_window is None


def test_valid_forms() -> None:
    c = CompactConfig.from_mapping(
        {
            "compact_trigger": [("tokens", 10), ("fraction", 0.5), ("messages", 7)],
            "compact_keep": ("fraction", 0.1),
            "context_window": 1000,
            "compact_offload_dir": "/tmp/x",
            "compact_summary_prompt": "sum it",
        }
    )
    assert c.token_trigger == 10 and c.message_trigger == 7
    assert c.keep.tokens(c.context_window) == 100
    assert CompactConfig.from_mapping({"compact_trigger": ("fraction", 1.0), "context_window": 8}).token_trigger == 8


BAD = [
    ("compact_trigger", ("tokens", 0)),
    ("compact_trigger", ("tokens", -5)),
    ("compact_trigger", ("tokens", 1.5)),
    ("compact_trigger", ("tokens", True)),
    ("compact_trigger", ("messages", 0)),
    ("compact_trigger", ("messages", 2.0)),
    ("compact_trigger", ("fraction", 0.0)),
    ("compact_trigger", ("fraction", 1.5)),
    ("compact_trigger", ("fraction", -0.1)),
    ("compact_trigger", ("fraction", 1)),
    ("compact_trigger", ("fraction", True)),
    ("compact_trigger", ("fraction", 0.5)),  # no context_window
    ("compact_trigger", ("percent", 5)),
    ("compact_trigger", "tokens"),
    ("compact_trigger", ("tokens",)),
    ("compact_trigger", ("tokens", 5, 6)),
    ("compact_trigger", []),
    ("compact_trigger", [("tokens", 5), ("messages", 0)]),
    ("compact_trigger", 5),
    ("compact_trigger", None),
    ("compact_keep", ("messages", 0)),
    ("compact_keep", ("messages", 2.5)),
    ("compact_keep", ("tokens", -1)),
    ("compact_keep", ("fraction", 2.0)),
    ("compact_keep", ("fraction", 0.5)),  # no context_window
    ("compact_keep", ("all", 1)),
    ("compact_keep", "messages"),
    ("compact_keep", [("messages", 3), ("tokens", 5)]),
    ("compact_keep", False),
    ("compact_offload_dir", ""),
    ("compact_offload_dir", 5),
    ("compact_offload_dir", "a\x00b"),
    ("compact_offload_dir", None),
    ("compact_summary_prompt", ""),
    ("compact_summary_prompt", "   "),
    ("compact_summary_prompt", 3),
    ("context_window", 0),
    ("context_window", -1),
    ("context_window", 1.5),
    ("context_window", True),
    ("context_window", "1000"),
]


@pytest.mark.parametrize(("key", "value"), BAD)
def test_bad_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        CompactConfig.from_mapping({key: value})
    assert repr(key) in str(info.value)


def _needs_window(value: object) -> bool:
    return isinstance(value, tuple) and value == ("fraction", 0.5)


@pytest.mark.parametrize(("key", "value"), BAD)
def test_bad_config_is_refused_when_the_state_is_made(key: str, value: object) -> None:
    if _needs_window(value):  # the runtime fills the window in from the provider: the compactor refuses
        state = State(agent_id="a", config={key: value})
        with pytest.raises(ConfigError, match=key):
            Compactor().should_compact(state)
        return
    with pytest.raises(ConfigError, match=key):
        State(agent_id="a", config={key: value})
    good = State(agent_id="a").to_dict()
    good["config"] = {key: value}
    with pytest.raises(ConfigError, match=key):
        State.from_dict(good)


def test_unknown_keys_are_refused_with_the_closest_known_one() -> None:
    with pytest.raises(ConfigError, match="compact_trigerr"):
        CompactConfig.from_mapping({"compact_trigerr": ("tokens", 5)})
    with pytest.raises(ConfigError, match=r"'context_windw' \(did you mean 'context_window'\?\)"):
        State(agent_id="a", config={"context_windw": 64_000})
    with pytest.raises(ConfigError, match="unknown config key 'foo'; known keys: compact_keep"):
        State.from_json(b'{"agent_id": "a", "config": {"foo": 1}}')
    with pytest.raises(ConfigError, match="max_steps"):  # an agent option, not a config key
        State(agent_id="a", config={"max_steps": 5})


def test_keys_namespaced_for_user_data_are_kept() -> None:
    config = {"x-ticket": "T-12", "myapp.user": {"id": 7}, "compact_keep": ("messages", 3)}
    state = State(agent_id="a", config=config)
    assert state.config["x-ticket"] == "T-12" and state.config["myapp.user"]["id"] == 7
    assert State.from_json(state.to_json()).config == state.config


def test_a_checked_config_is_not_checked_again() -> None:
    state = State(agent_id="a", config={"compact_trigger": ("tokens", 50)})
    assert state.evolve(compactions=1).config is state.config  # taken as it is: no copy, no re-check
    assert State(agent_id="b", config=state.config).config is state.config
    mutable = {"compact_trigger": ("tokens", 50)}
    State(agent_id="c", config=mutable)
    mutable["compact_trigger"] = ("tokens", -1)  # a dict given again is checked again
    with pytest.raises(ConfigError, match="compact_trigger"):
        State(agent_id="c", config=mutable)


def test_the_default_trigger_is_a_fraction_of_a_known_window() -> None:
    assert CompactConfig.from_mapping({"context_window": 64_000}).token_trigger == 54_400
    assert CompactConfig.from_mapping({}).token_trigger == 170_000
    given = {"context_window": 64_000, "compact_trigger": ("tokens", 60_000)}
    assert CompactConfig.from_mapping(given).token_trigger == 60_000

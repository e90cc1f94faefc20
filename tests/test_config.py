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


@pytest.mark.parametrize(("key", "value"), BAD)
def test_bad_config_through_the_compactor(key: str, value: object) -> None:
    state = State(agent_id="a", config={key: value})
    with pytest.raises(ConfigError, match=key):
        Compactor().should_compact(state)


def test_unknown_compact_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="compact_trigerr"):
        CompactConfig.from_mapping({"compact_trigerr": ("tokens", 5)})
    CompactConfig.from_mapping({"max_steps": 5})  # other keys belong to other layers

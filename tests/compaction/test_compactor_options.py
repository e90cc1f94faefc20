"""The Compactor's options: one validated attrs class, the same names as keywords."""

from __future__ import annotations

import math

import attrs
import pytest

from cmdc import Compactor, ConfigError, Message, State
from cmdc.compaction import CompactorOptions
from cmdc.compaction.attempts import default_should_retry
from cmdc.compaction.finalize import default_finalize
from cmdc.providers import ExtractiveSummarizer


async def instant(messages: object, instruction: str) -> str:
    return "summary"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retries", -1),
        ("retries", True),
        ("retries", 1.5),
        ("retry_backoff", -0.1),
        ("retry_backoff", True),
        ("retry_backoff", math.inf),
        ("max_backoff", "1"),
        ("max_extra_passes", -1),
        ("summary_budget", 0),
        ("pin_budget", False),
        ("reduce_tokens", 2.0),
        ("user_message_budget", -5),
        ("summarizer_window", 0),
        ("summarizer_input_tokens", 0),
        ("summarizer_timeout", 0),
        ("summarizer_timeout", math.nan),
        ("summarizer_timeout", True),
        ("should_retry", 3),
        ("failover", "x"),
        ("finalize", 1),
        ("user_message_filter", object()),
        ("token_counter", 5),
        ("on_event", "log"),
        ("summarizer", 42),
        ("fallbacks", [instant, 7]),
        ("fallbacks", "abc"),
        ("fallbacks", 3),
    ],
)
def test_malformed_option_names_itself(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=option if option != "summarizer" else "summarizer"):
        CompactorOptions(**{option: value})
    with pytest.raises(ConfigError):
        Compactor(**{option: value})  # type: ignore[arg-type]


def test_defaults() -> None:
    o = CompactorOptions()
    assert isinstance(o.summarizer, ExtractiveSummarizer)
    assert o.should_retry is default_should_retry
    assert o.finalize is default_finalize
    assert (o.retries, o.reduce_tokens, o.max_extra_passes, o.commit_journal) == (3, 2_000, 2, True)


def test_compactor_attributes_read_and_check_the_options() -> None:
    c = Compactor(instant, retries=1)
    assert c.summarizer is instant and c.retries == 1 and c.options.retries == 1
    c.retries = 5
    assert c.options.retries == 5
    with pytest.raises(ConfigError, match="retries"):
        c.retries = -2
    assert c.retries == 5  # a refused value changes nothing


async def test_compactor_from_options(tmp_path: object) -> None:
    options = CompactorOptions(summarizer=instant, retries=0)
    c = Compactor(options=options)
    assert c.options is options
    state = State(
        agent_id="opt",
        messages=tuple(Message.user(f"message {i} " * 20) for i in range(12)),
        config={"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 2)},
    )
    result = await c.force_compact(state)
    assert result.report.summarizer == "instant"  # type: ignore[union-attr]
    with pytest.raises(ConfigError):
        Compactor(options=attrs.asdict(options))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Compactor(instant, options=options)

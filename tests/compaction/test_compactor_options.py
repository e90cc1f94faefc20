"""The Compactor's options: one validated attrs class, the same names as keywords."""

from __future__ import annotations

import inspect
import math

import attrs
import pytest

from cmdc import Compactor, ConfigError, Message, Plugin, State
from cmdc.compaction import CompactorOptions
from cmdc.compaction.attempts import default_should_retry
from cmdc.compaction.finalize import default_finalize
from cmdc.errors import InvalidPlugin
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


class Early(Plugin):
    priority = 10


class Late(Plugin):
    priority = 90


def test_the_keywords_are_the_options_fields_once() -> None:
    # Compactor's parameters are CompactorOptions' (help() and inspect show them), nothing more
    fields = [f.name for f in attrs.fields(CompactorOptions)]
    assert list(inspect.signature(Compactor).parameters) == fields
    assert list(inspect.signature(CompactorOptions).parameters) == fields
    # no hand-written copy: the older spelling's forwarders are made from that one list, one per
    # option (a class `__getattr__` instead made every attribute read of a Compactor slower)
    forwarders = {name for name, value in vars(Compactor).items() if type(value).__name__ == "_Option"}
    assert forwarders == set(fields) - {"plugins"}  # plugins: a property of its own
    assert not hasattr(Compactor, "__getattr__")


def test_an_unknown_keyword_is_refused_by_name_with_the_closest_option() -> None:
    # before: TypeError "CompactorOptions.__init__() got an unexpected keyword argument 'retrys'",
    # naming a class the caller never wrote; spawn already said "unknown spawn option(s)"
    with pytest.raises(ConfigError, match=r"unknown Compactor option\(s\) \['retrys'\] \(did you mean 'retries'\?\)"):
        Compactor(retrys=3)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"\['bogus', 'pin_tsk'\] \(did you mean 'pin_task'\?\); Compactor options"):
        Compactor(bogus=1, pin_tsk=False)  # type: ignore[call-arg]


def test_plugins_are_an_option_kept_in_run_order() -> None:
    late, early = Late(), Early()
    c = Compactor(instant, plugins=[late, early])
    assert c.plugins == c.options.plugins == (early, late)
    last = Late()
    c.add_plugin(last)
    assert c.plugins == (early, late, last)
    for bad in (5, "plugins", Late(), [object()], [Late, early]):
        with pytest.raises(InvalidPlugin):
            Compactor(plugins=bad)  # type: ignore[arg-type]


def test_from_options_keeps_the_value_and_refuses_anything_else() -> None:
    options = CompactorOptions(summarizer=instant, plugins=[Late()])
    c = Compactor.from_options(options)
    assert c.options is options and c.summarizer is instant  # type: ignore[attr-defined]
    for bad in (None, {"retries": 1}, Compactor()):
        with pytest.raises(ConfigError, match="CompactorOptions"):
            Compactor.from_options(bad)  # type: ignore[arg-type]
    with_plugins = Compactor(options=options, plugins=[Early()])  # type: ignore[call-arg]  # the older spelling
    assert [type(p) for p in with_plugins.plugins] == [Early]


def test_the_older_attribute_spelling_reads_and_checks_only_options() -> None:
    c = Compactor(instant)
    assert c.pin_task is True and c.commit_journal is True  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="retrys"):
        c.retrys  # type: ignore[attr-defined]  # noqa: B018
    c.plugins = [Late()]  # type: ignore[misc]  # an option: checked, then the options replaced
    assert [type(p) for p in c.options.plugins] == [Late]
    with pytest.raises(InvalidPlugin):
        c.plugins = [3]  # type: ignore[misc]
    with pytest.raises(ConfigError, match="summarizer_timeout"):
        c.summarizer_timeout = -1
    assert c.options.summarizer_timeout == 300.0

"""`HTTPSettings`: the one settings value both HTTP providers take (timeouts, retries, the call
deadline, headers, reply limits), as `settings=` or as keywords, each value checked."""

from __future__ import annotations

import math
import subprocess
import sys
import typing
from typing import Any

import attrs
import pytest
from fakes import Endpoint, anthropic_reply, openai_reply

from cmdc import ConfigError, Message
from cmdc.providers import AnthropicProvider, HTTPSettings, ModelRequest, OpenAIProvider, ReplyLimits
from cmdc.providers._settings import HTTPKeywords

PROVIDERS = [OpenAIProvider, AnthropicProvider]


def test_defaults_and_the_provider_reads_them() -> None:
    s = HTTPSettings()
    assert (s.timeout, s.max_retries, s.deadline, dict(s.headers), s.limits) == (60.0, 4, 900.0, {}, ReplyLimits())
    p = OpenAIProvider("m", base_url="http://local.test/v1")
    assert p.settings == s and (p.timeout, p.max_retries, p.deadline, p.limits) == (60.0, 4, 900.0, ReplyLimits())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_keywords_replace_fields_of_settings(provider: Any) -> None:
    limits = ReplyLimits(max_tool_calls=3)
    base = HTTPSettings(timeout=5, max_retries=0, headers={"x-team": "a"}, limits=limits)
    p = provider("m", base_url="http://local.test", settings=base, max_retries=2, deadline=None)
    assert p.settings == attrs.evolve(base, max_retries=2, deadline=None)
    assert p.settings.timeout == 5.0 and isinstance(p.settings.timeout, float)
    assert p.limits is limits and p.headers == {"x-team": "a"}
    keywords: dict[str, Any] = {"timeout": 5, "max_retries": 2, "deadline": None, "headers": {"x-team": "a"}}
    same = provider("m", base_url="http://local.test", limits=limits, **keywords)
    assert same.settings == p.settings
    assert provider("m", base_url="http://local.test", settings=base).settings is base


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout", -1),
        ("timeout", 0),
        ("timeout", math.nan),
        ("timeout", math.inf),
        ("timeout", True),
        ("timeout", "60"),
        ("max_retries", -1),
        ("max_retries", 1.5),
        ("max_retries", True),
        ("max_retries", None),
        ("deadline", 0),
        ("deadline", "soon"),
        ("deadline", -math.inf),
        ("limits", {"max_reply_bytes": 1}),
        ("limits", 5),
    ],
)
def test_a_malformed_value_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        HTTPSettings(**{field: value})
    for provider in PROVIDERS:  # the same check through the keyword
        with pytest.raises(ConfigError, match=field):
            provider("m", base_url="http://local.test", **{field: value})


@pytest.mark.parametrize(
    "headers",
    [
        "authorization: x",
        {"a": 1},
        {1: "a"},
        {"bad name": "v"},
        {"": "v"},
        {"x-evil": "v\r\nhost: attacker"},
        {"x-nul": "v\x00"},
        [("a", "b")],
    ],
)
def test_hostile_headers_are_refused_without_showing_values(headers: object) -> None:
    with pytest.raises(ConfigError, match="header") as info:
        HTTPSettings(headers=headers)  # type: ignore[arg-type]
    assert "attacker" not in str(info.value)


def test_headers_are_read_only_and_repr_hides_their_values() -> None:
    given = {"api-key": "sk-secret"}
    s = HTTPSettings(headers=given)
    given["api-key"] = "changed"
    assert s.headers == {"api-key": "sk-secret"}
    with pytest.raises(TypeError):
        s.headers["api-key"] = "x"  # type: ignore[index]
    assert "sk-secret" not in repr(s) and "'api-key'" in repr(s)
    assert hash(s) == hash(HTTPSettings(headers={"api-key": "other"}))  # hashable; headers left out of the hash


def test_settings_must_be_settings_and_keywords_must_exist() -> None:
    for bad in ({"timeout": 5}, ReplyLimits(), 5):
        with pytest.raises(ConfigError, match="HTTPSettings"):
            OpenAIProvider("m", base_url="http://local.test", settings=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"OpenAIProvider.*'timout'"):
        OpenAIProvider("m", base_url="http://local.test", timout=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"AnthropicProvider.*'retries'"):
        AnthropicProvider("m", base_url="http://local.test", retries=5)  # type: ignore[call-arg]


def test_the_keywords_are_the_settings_fields() -> None:
    # HTTPKeywords (the providers' **http) lists HTTPSettings' fields: the same names, and the
    # same types but for None, which a keyword may pass for a field's default
    fields = {f.name: f for f in attrs.fields(HTTPSettings)}
    hints = typing.get_type_hints(HTTPKeywords)
    assert list(hints) == list(fields)
    settings_hints = typing.get_type_hints(HTTPSettings)
    for name, hint in hints.items():
        assert hint in (settings_hints[name], settings_hints[name] | None), name


async def test_the_settings_reach_the_request() -> None:
    for provider, reply in ((OpenAIProvider, openai_reply()), (AnthropicProvider, anthropic_reply())):
        endpoint = Endpoint((503, {"error": {"message": "busy"}}), (200, reply))
        settings = HTTPSettings(headers={"x-team": "blue"}, max_retries=1, timeout=7.5)
        p = provider("m", base_url="http://local.test", client=endpoint.client(), settings=settings)
        await p.complete(ModelRequest([Message.user("hi")]))
        assert len(endpoint.requests) == 2  # one retry, as settings said
        assert all(r.headers["x-team"] == "blue" for r in endpoint.requests)
        assert endpoint.requests[0].extensions["timeout"]["read"] == 7.5


def test_settings_import_without_httpx() -> None:
    code = (
        "import sys\n"
        "sys.modules['httpx'] = None\n"
        "from cmdc.providers import HTTPSettings, ReplyLimits\n"
        "assert HTTPSettings(limits=ReplyLimits(max_tool_calls=2)).limits.max_tool_calls == 2\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr

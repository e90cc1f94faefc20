"""The HTTP providers' configuration: the environment, refused settings, a missing key, and a
core that imports without httpx."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from fakes import (
    Endpoint,
    anthropic_reply,
    openai_reply,
)

import cmdc
from cmdc import ConfigError, Message
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider


async def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://vllm.test:8000/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.test/anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    o_end, a_end = Endpoint((200, openai_reply())), Endpoint((200, anthropic_reply()))
    openai = OpenAIProvider("m", client=o_end.client())
    anthropic = AnthropicProvider("c", client=a_end.client())
    await openai.complete(ModelRequest([Message.user("hi")]))
    await anthropic.complete(ModelRequest([Message.user("hi")]))
    assert str(o_end.requests[0].url) == "http://vllm.test:8000/v1/chat/completions"
    assert o_end.requests[0].headers["authorization"] == "Bearer sk-env"
    assert str(a_end.requests[0].url) == "https://proxy.test/anthropic/v1/messages"
    assert a_end.requests[0].headers["x-api-key"] == "sk-ant-env"
    assert "sk-env" not in repr(openai) and "sk-ant-env" not in repr(anthropic)
    assert openai.name == "openai:m" and anthropic.name == "anthropic:c"

    # arguments win over the environment; Azure-style: the query string is kept, a header carries the key
    azure_end = Endpoint((200, openai_reply()))
    azure = OpenAIProvider(
        "gpt-4o",
        base_url="https://res.openai.azure.com/openai/deployments/gpt4o?api-version=2024-10-21",
        api_key="",
        headers={"api-key": "azure-key"},
        client=azure_end.client(),
    )
    await azure.complete(ModelRequest([Message.user("hi")]))
    sent = azure_end.requests[0]
    assert (
        str(sent.url) == "https://res.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
    )
    assert sent.headers["api-key"] == "azure-key" and "authorization" not in sent.headers


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(cmdc.ConfigError, match="model"):
        OpenAIProvider("")
    with pytest.raises(cmdc.ConfigError, match="max_retries"):
        OpenAIProvider("m", max_retries=-1)
    with pytest.raises(cmdc.ConfigError, match="timeout"):
        AnthropicProvider("m", timeout=0)
    with pytest.raises(cmdc.ConfigError, match="base_url"):
        OpenAIProvider("m", base_url="ftp://x")
    with pytest.raises(cmdc.ConfigError, match="max_output_tokens"):
        AnthropicProvider("m", max_output_tokens=0)


def test_cmdc_providers_imports_without_httpx() -> None:
    code = (
        "import sys\n"
        "sys.modules['httpx'] = None\n"
        "sys.modules['stamina'] = None\n"
        "import cmdc, cmdc.providers\n"
        "from cmdc.providers import ScriptedProvider, ModelRequest\n"
        "from cmdc.providers.overflow import classify\n"
        "assert classify(400, {}, b'prompt is too long').__class__.__name__ == 'ContextOverflow'\n"
        "try:\n"
        "    cmdc.providers.OpenAIProvider\n"
        "except ImportError as exc:\n"
        "    assert 'cmdc-agents[http]' in str(exc)\n"
        "else:\n"
        "    raise SystemExit('imported without httpx')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_no_api_key_for_the_vendor_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIProvider("gpt-4.1")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider("claude-sonnet-4-5")
    monkeypatch.setenv("OPENAI_API_KEY", "")  # empty counts as unset
    with pytest.raises(ConfigError, match="no API key"):
        OpenAIProvider("gpt-4.1", base_url="https://api.openai.com/v1/")
    # a key from anywhere, another server, or your own client: no error
    assert OpenAIProvider("gpt-4.1", api_key="sk-x").api_key == "sk-x"
    OpenAIProvider("gpt-4.1", headers={"Authorization": "Bearer sk-x"})
    OpenAIProvider("qwen", base_url="http://localhost:8000/v1")
    AnthropicProvider("claude", headers={"x-api-key": "k"})
    AnthropicProvider("claude", base_url="http://localhost:8080")
    OpenAIProvider("gpt-4.1", client=httpx.AsyncClient())
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    assert AnthropicProvider("claude").api_key == "k"

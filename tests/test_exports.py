"""The public API contract (DESIGN.md, "Public API contract"): every name there is importable
from where the contract says, with the shape it promises. Names are added, never renamed: a
failure here means a user's import broke."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import cmdc

CMDC_NAMES = [
    "Message",
    "ToolCall",
    "TokenUsage",
    "State",
    "Compactor",
    "CompactConfig",
    "Compacted",
    "Skipped",
    "CompactionReport",
    "OffloadStore",
    "Plugin",
    "Skip",
    "Abort",
    "open_runtime",
    "tool",
    "ContextOverflow",
    "CompactionError",
    "ConfigError",
    "CmdcError",
    "estimate_tokens_from_messages",
    # the typed plugin contexts, one per hook
    "OnStart",
    "BeforeRequest",
    "AfterResponse",
    "BeforeTool",
    "AfterTool",
    "BeforeCompact",
    "AfterCompact",
    "OnError",
    "OnStop",
    # the error hierarchy the conventions name
    "OffloadError",
    "OffloadCorrupted",
    "ProviderError",
    "MailboxFull",
    "AgentNotFound",
]
PROVIDER_NAMES = [
    "ModelRequest",
    "ScriptedProvider",
    "SimulatedModel",
    "ExtractiveSummarizer",
    "OpenAIProvider",
    "AnthropicProvider",
]


@pytest.mark.parametrize("name", CMDC_NAMES)
def test_cmdc_exports(name: str) -> None:
    assert name in cmdc.__all__, f"{name} is not in cmdc.__all__"
    assert getattr(cmdc, name) is not None


@pytest.mark.parametrize("name", PROVIDER_NAMES)
def test_provider_exports(name: str) -> None:
    providers = importlib.import_module("cmdc.providers")
    assert getattr(providers, name) is not None


def test_all_is_exact() -> None:
    assert len(set(cmdc.__all__)) == len(cmdc.__all__)
    for name in cmdc.__all__:
        assert hasattr(cmdc, name), f"cmdc.__all__ names {name}, which cmdc lacks"
    assert isinstance(cmdc.__version__, str) and cmdc.__version__


def test_the_promised_shapes() -> None:
    for factory in ("system", "user", "assistant", "tool_result"):
        assert callable(getattr(cmdc.Message, factory))
    for attr in ("append", "token_usage", "compactions", "to_json", "from_json", "insert_after_summary"):
        assert hasattr(cmdc.State, attr)
    for method in ("compact_config", "estimate_tokens", "should_compact", "maybe_compact", "force_compact"):
        assert callable(getattr(cmdc.Compactor, method))
    for method in ("append", "read", "search"):
        assert inspect.iscoroutinefunction(getattr(cmdc.OffloadStore, method))
    report = {f.name for f in attrs.fields(cmdc.CompactionReport)}
    assert {
        "reason",
        "tokens_before",
        "tokens_after",
        "messages_before",
        "messages_after",
        "evicted",
        "offload_path",
    } <= report
    assert {f.name for f in attrs.fields(cmdc.Compacted)} >= {"state", "report"}
    assert {f.name for f in attrs.fields(cmdc.Skipped)} >= {"state", "reason"}
    assert {f.name for f in attrs.fields(cmdc.BeforeCompact)} >= {"state", "evicted", "kept", "reason"}
    assert {f.name for f in attrs.fields(cmdc.AfterCompact)} >= {"state", "report"}
    spawn = inspect.signature(cmdc.Runtime.spawn).parameters
    assert {"name", "provider", "instructions", "tools", "plugins", "config", "summarizer"} <= set(spawn)
    for method in ("prompt", "state", "stop", "compact"):
        assert inspect.iscoroutinefunction(getattr(cmdc.AgentRef, method))
    assert callable(cmdc.Runtime.whereis)
    for error in (cmdc.ConfigError, cmdc.ContextOverflow, cmdc.CompactionError, cmdc.OffloadError):
        assert issubclass(error, cmdc.CmdcError)
    assert issubclass(cmdc.OffloadCorrupted, cmdc.OffloadError)
    providers = importlib.import_module("cmdc.providers")
    for name in ("OpenAIProvider", "AnthropicProvider"):
        params = inspect.signature(getattr(providers, name)).parameters
        assert {"model", "base_url", "api_key"} <= set(params)


def test_the_cluster_face() -> None:
    pytest.importorskip("ray", reason="cmdc.ray needs the ray extra")
    ray = importlib.import_module("cmdc.ray")
    assert callable(ray.open_cluster)
    params = inspect.signature(ray.open_cluster).parameters
    assert {"address", "store"} <= set(params)
    for method in ("spawn", "get", "whereis", "subscribe"):
        assert callable(getattr(ray.ClusterRuntime, method))
    for method in ("prompt", "send", "state", "compact", "stop", "ping", "abort"):
        assert inspect.iscoroutinefunction(getattr(ray.ClusterAgentRef, method))


def test_the_mcp_face() -> None:
    """`cmdc.mcp.stdio(command, *args)` makes a tool source `spawn(tools=[...])` takes."""
    mcp = importlib.import_module("cmdc.mcp")
    tools = importlib.import_module("cmdc.tools")
    server = mcp.stdio("npx", "-y", "@modelcontextprotocol/server-everything")
    assert isinstance(server, tools.ToolSource)
    assert callable(mcp.http) and callable(mcp.in_process)


def test_mcp_is_imported_on_first_use_only() -> None:
    """`import cmdc` never imports the SDK; `cmdc.mcp` after a plain `import cmdc` does."""
    code = (
        "import sys, cmdc\n"
        "assert 'mcp' not in sys.modules and 'cmdc.mcp' not in sys.modules\n"
        "assert callable(cmdc.mcp.stdio) and 'mcp' in sys.modules\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr

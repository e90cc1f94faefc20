"""The public API contract (docs/design.md, "Public API contract"): every name there is importable
from where the contract says, with the shape it promises. Names are added, never renamed: a
failure here means a user's import broke. Every public module's `__all__` is pinned below, so
a name enters or leaves the public surface on purpose only (edit the pinned list with it)."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def params(f: object) -> set[str]:
    return set(inspect.signature(f).parameters)  # type: ignore[arg-type]


def test_the_promised_signatures() -> None:
    """The call forms docs/design.md writes out, by parameter name (a rename breaks a keyword call)."""
    assert {"text", "tool_calls", "usage"} <= params(cmdc.Message.assistant)
    assert {"call_id", "content", "is_error"} <= params(cmdc.Message.tool_result)
    assert inspect.signature(cmdc.Message.tool_result).parameters["is_error"].default is False
    assert {"input_tokens", "output_tokens", "total_tokens"} <= {f.name for f in attrs.fields(cmdc.TokenUsage)}
    assert {"id", "name", "arguments"} <= {f.name for f in attrs.fields(cmdc.ToolCall)}
    assert {"agent_id", "messages", "config"} <= params(cmdc.State)
    assert {"summarizer", "plugins", "token_counter"} <= params(cmdc.Compactor)
    assert {"instruction"} <= params(cmdc.Compactor.force_compact)
    assert "compaction" in params(cmdc.OffloadStore.append)
    assert inspect.signature(cmdc.OffloadStore.search).parameters["limit"].default == 10
    assert "store" in params(cmdc.open_runtime)
    for method in ("send", "prompt", "state", "stop", "compact"):
        assert inspect.iscoroutinefunction(getattr(cmdc.AgentRef, method)), method
    for method in ("send_nowait", "abort", "add_plugin"):
        assert callable(getattr(cmdc.AgentRef, method)), method
    assert issubclass(cmdc.MailboxFull, cmdc.CmdcError) and issubclass(cmdc.AgentNotFound, cmdc.CmdcError)
    assert issubclass(cmdc.ProviderError, cmdc.CmdcError)
    report = {f.name for f in attrs.fields(cmdc.CompactionReport)}
    assert {"summary_tokens", "attempts", "duration"} <= report  # summary size, attempts, duration
    providers = importlib.import_module("cmdc.providers")
    assert {"messages", "tools"} <= params(providers.ModelRequest)
    assert "replies" in params(providers.ScriptedProvider)
    assert "context_window" in params(providers.SimulatedModel)


def test_the_plugin_hooks() -> None:
    """Every hook docs/design.md names is a coroutine on `Plugin` taking its context; `priority` orders."""
    hooks = {
        "on_start": cmdc.OnStart,
        "before_request": cmdc.BeforeRequest,
        "after_response": cmdc.AfterResponse,
        "before_tool": cmdc.BeforeTool,
        "after_tool": cmdc.AfterTool,
        "before_compact": cmdc.BeforeCompact,
        "after_compact": cmdc.AfterCompact,
        "on_error": cmdc.OnError,
        "on_stop": cmdc.OnStop,
    }
    for hook, context in hooks.items():
        method = getattr(cmdc.Plugin, hook)
        assert inspect.iscoroutinefunction(method), hook
        assert params(method) == {"self", "ctx"}, hook
        assert attrs.has(context) and attrs.fields(context)[0].name == "state", context
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            object.__new__(context).__setattr__("state", None)
    assert isinstance(cmdc.Plugin.priority, int)
    assert {f.name for f in attrs.fields(cmdc.Skip)} == {"reason"} == {f.name for f in attrs.fields(cmdc.Abort)}


def test_the_promised_values() -> None:
    """Values behave as the contract writes: ids, roles, a summary's mark, the JSON round trip,
    the config keys with their defaults, a malformed value named."""
    call = cmdc.ToolCall(id="c1", name="search", arguments={"q": "x"})
    usage = cmdc.TokenUsage(input_tokens=3, output_tokens=2, total_tokens=5)
    messages = (
        cmdc.Message.system("s"),
        cmdc.Message.user("u"),
        cmdc.Message.assistant("a", tool_calls=(call,), usage=usage),
        cmdc.Message.tool_result("c1", "r"),
    )
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert len({m.id for m in messages}) == 4 and all(isinstance(m.id, str) and m.id for m in messages)
    assert messages[2].tool_calls == (call,) and messages[3].tool_call_id == "c1"
    with pytest.raises(TypeError):
        messages[1].metadata["x"] = 1  # type: ignore[index]
    state = cmdc.State(agent_id="a1", messages=messages, config={"compact_keep": ("messages", 3)})
    state = state.append(cmdc.Message.user("more"))
    assert state.compactions == 0 and state.token_usage > 0
    assert cmdc.State.from_json(state.to_json()) == state
    assert cmdc.State.from_json(state.to_json()).config["compact_keep"] == ("messages", 3)
    config = cmdc.Compactor().compact_config(cmdc.State(agent_id="a1"))
    assert config == cmdc.CompactConfig.from_mapping({})
    assert cmdc.Compactor().compact_config(state) == cmdc.CompactConfig.from_mapping(
        {
            "compact_trigger": ("tokens", 170_000),
            "compact_keep": ("messages", 3),
            "compact_offload_dir": ".cmdc/conversation_history",
        }
    )
    for key, bad in (
        ("compact_trigger", ("tokens", 0)),
        ("compact_keep", ("fraction", 0.5)),
        ("context_window", True),
        ("compact_summary_prompt", 5),
    ):
        with pytest.raises(cmdc.ConfigError, match=key):
            cmdc.CompactConfig.from_mapping({key: bad})
    assert cmdc.estimate_tokens_from_messages(messages) > 0


async def test_a_compaction_as_the_contract_shows_it(tmp_path: Path) -> None:
    """`match` on the outcome, the summary's mark, the journal read back in order, once."""
    config = {"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 2)}
    words = "about the deployment and its rollback plan " * 8
    history = [cmdc.Message.user(f"question {i}: {words}") for i in range(8)]
    state = cmdc.State(agent_id="a1", messages=history, config=config)
    compactor = cmdc.Compactor(summarizer=cmdc.ExtractiveSummarizer())
    assert not compactor.should_compact(state) and compactor.estimate_tokens(state) == state.token_usage
    match await compactor.force_compact(state):
        case cmdc.Compacted(state=new, report=report):
            assert report.reason == "forced" and report.evicted == len(history) - 3  # the task is pinned
        case cmdc.Skipped(reason=reason):
            pytest.fail(f"skipped: {reason}")
    summary = next(m for m in new.messages if m.role == "user" and m.metadata.get("cmdc.kind") == "summary")
    assert new.messages[0] == history[0] and new.messages[-2:] == tuple(history[-2:])
    assert summary.id not in {m.id for m in history}
    journal = await cmdc.OffloadStore(tmp_path).read("a1")
    assert [m.id for m in journal] == [m.id for m in history[1 : 1 + report.evicted]]
    assert isinstance(await compactor.maybe_compact(new), cmdc.Skipped)


def test_version_on_the_command_line() -> None:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "cmdc", "--version"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and cmdc.__version__ in out.stdout


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


OLD_PATHS = {
    # the flat modules before the runtime and cluster packages (issue 25): each old module is
    # the new one (an alias), so imports and monkeypatches through the old path keep working
    "cmdc.agent": ("cmdc.runtime.agent", ["Agent", "AgentOptions", "AgentRef", "RestartPolicy", "current_chain"]),
    "cmdc.bus": ("cmdc.runtime.bus", ["EVENTS_DROPPED", "EventBus", "Subscription"]),
    "cmdc.runtime": ("cmdc.runtime", ["Runtime", "open_runtime", "AgentRef", "AgentOptions", "AgentHandle"]),
    "cmdc.ray": ("cmdc.cluster.runtime", ["ClusterAgentRef", "ClusterRuntime", "ClusterSubscription", "Node"]),
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_the_old_module_paths(old: str) -> None:
    new, names = OLD_PATHS[old]
    if old == "cmdc.ray":
        pytest.importorskip("ray", reason="cmdc.ray needs the ray extra")
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module is sys.modules[old] and module is getattr(
        importlib.import_module(old.rpartition(".")[0]), old.rpartition(".")[2]
    )
    for name in names:
        assert getattr(module, name) is not None, name
    for name in ("AgentOptions", "AgentRef", "Runtime", "open_runtime", "AgentHandle", "SpawnOptions"):
        if hasattr(module, name):
            assert getattr(module, name) is getattr(cmdc, name), name


def test_import_cmdc_never_imports_ray() -> None:
    """The cluster (extra `ray`) is imported with `cmdc.ray` only; the old paths neither."""
    code = "import sys, cmdc, cmdc.agent, cmdc.bus, cmdc.runtime\nassert 'ray' not in sys.modules, 'ray imported'\n"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


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
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


# -- every public module's names, pinned ---------------------------------------------------------

# fmt: off
ERROR_NAMES = [
    "AgentNotFound", "AgentStopped", "AuthError", "BadRequest", "ChatFileError", "CheckpointCorrupted",
    "CheckpointError", "CmdcDeprecationWarning", "CmdcError", "CompactionAborted", "CompactionError",
    "CompactionIncomplete", "CompactionThrashing", "ConfigError", "ConnectionFailed", "ContextOverflow",
    "DelegationRefused", "DemoError", "HTTPProviderError", "IncompleteStream", "IndexUnavailable", "InvalidMessage",
    "InvalidPlugin", "InvalidState", "JournalLost", "LeaseLost", "MCPServerError", "MCPToolError", "MailboxFull",
    "NameLeased", "NodeLost", "OffloadCorrupted", "OffloadError", "OutputBudgetOverflow", "Overloaded",
    "PluginAborted", "PluginReturnError", "ProviderError", "ProviderTimeout", "QuotaExceeded", "RateLimited",
    "ReplyTooLarge", "RequestSkipped", "ServerError", "StepLimitReached", "StoreRefused", "StoreUnavailable",
    "SummarizerError", "SummarizerTimeout", "TooManyToolCalls", "ToolArgumentsError", "TurnAborted", "UsageError",
]
"""`cmdc.errors.__all__`: every class of the hierarchy (all exported from `cmdc` as well)."""

PUBLIC: dict[str, list[str]] = {
    "cmdc": [
        "Abort", "AfterCompact", "AfterResponse", "AfterTool", "AgentHandle", "AgentOptions", "AgentRef",
        "BeforeCompact",
        "BeforeRequest", "BeforeTool", "CompactConfig", "Compacted", "CompactionReport", "Compactor",
        "DEFAULT_SUMMARY_PROMPT", "Event", "ExtractiveSummarizer", "ImagePart", "JournalRecord", "Message",
        "OffloadStore", "OnError", "OnStart", "OnStop", "Plugin", "RehydrateReads", "Runtime", "Skip", "Skipped",
        "SpawnOptions", "State", "SummaryAttempt", "TextPart", "TokenUsage", "Tool", "ToolCall", "__version__",
        "compact_context_tool", "estimate_message_tokens", "estimate_tokens_from_messages", "open_runtime",
        "split_messages", "tool", "validate_agent_id",
        *ERROR_NAMES,
    ],
    "cmdc.errors": ERROR_NAMES,
    "cmdc.compaction": [
        "CompactConfig", "Compacted", "CompactionReport", "Compactor", "CompactorOptions", "DEFAULT_SUMMARY_PROMPT",
        "ExtractiveSummarizer", "SUMMARY_BUDGET", "Skipped", "Split", "Summarizer", "SummarizerBreaker",
        "SummaryAttempt", "Threshold", "TierConfig", "default_should_retry", "render_transcript", "split_messages",
    ],
    "cmdc.events": [
        "ACTIVATED", "COMPACTION_END", "COMPACTION_FAILED", "COMPACTION_FALLBACK", "COMPACTION_REQUESTED",
        "COMPACTION_SKIPPED", "COMPACTION_START", "COMPACTION_THRASH", "CONTINUED", "DEACTIVATED", "ERROR",
        "EVENTS_DROPPED", "Event", "EventSink", "FIELDS", "INDEX_FAILED", "INDEX_RETRY", "JOURNAL_DAMAGED",
        "JOURNAL_INDEX_REBUILT", "JOURNAL_LOST", "JOURNAL_REPAIRED", "LEASE_LOST", "LEVELS", "MCP_MESSAGE_CLIPPED",
        "MCP_SERVER_FAILED", "MCP_SERVER_GAVE_UP", "MCP_SERVER_RESTART", "MCP_TOOLS_CHANGED",
        "MCP_TOOLS_LIST_FAILED", "MCP_TOOL_DROPPED", "OVERFLOW", "PINS_OVER_BUDGET", "PLUGIN_ERROR",
        "QUEUED_DROPPED", "REQUEST", "RESPONSE", "RESTART", "RETRY", "STOPPED", "SUMMARIZER_ATTEMPT",
        "SUMMARIZER_FALLBACK", "SUMMARIZER_SUSPENDED", "TOOL_CALLS_REFUSED", "TOOL_END", "TOOL_RESULTS_CLIPPED",
        "TOOL_RESULTS_MASKED", "TOOL_RESULT_CAPPED", "TOOL_START", "TURN_END", "TURN_START", "USAGE_REFUSED",
    ],
    "cmdc.mcp": [
        "MCPServerError", "MCPToolError", "MCPTools", "Restarts", "http", "in_process", "stdio",
    ],
    "cmdc.message": [
        "ImagePart", "Message", "Part", "Role", "TextPart", "TokenUsage", "ToolCall",
    ],
    "cmdc.otel": [
        "CONTENT_ATTRIBUTES", "Tracing", "describe_span", "span_tree",
    ],
    "cmdc.plugins": [
        "Abort", "AfterCompact", "AfterResponse", "AfterTool", "BeforeCompact", "BeforeRequest", "BeforeTool",
        "Folded", "HookName", "LifecycleContext", "OnError", "OnStart", "OnStop", "Plugin", "PluginReturnError",
        "RequestContext", "ResponseContext", "Skip", "ToolContext", "check_result", "fold", "sort_plugins",
    ],
    "cmdc.providers": [
        "AnthropicProvider", "ExtractiveSummarizer", "HTTPSettings", "ModelRequest", "OpenAIProvider", "Provider",
        "ReplyLimits", "ScriptedProvider", "SimulatedModel", "ToolSchema",
    ],
    "cmdc.ray": [
        "ClusterAgentRef", "ClusterRuntime", "ClusterSubscription", "Node", "open_cluster",
    ],
    "cmdc.recall": [
        "DESCRIPTION", "recall_tool", "render_records",
    ],
    "cmdc.runtime": [
        "Agent", "AgentHandle", "AgentOptions", "AgentRef", "DEFAULT_LEASE_TTL", "DEFAULT_RECALL_BUDGET", "EventBus",
        "Grant", "RestartPolicy", "Runtime", "SpawnOptions", "Subscription", "open_runtime", "with_instructions",
    ],
    "cmdc.state": [
        "ConfigSource", "State", "config_keys", "validate_agent_id",
    ],
    "cmdc.store": [
        "Checkpoints", "FileCheckpoints", "FileStore", "JournalReader", "Leases", "OnNumbered", "PostgresStore",
        "Store", "StoreReport", "open_store",
    ],
    "cmdc.testing": [
        "EventSource", "RecordingSummarizer", "ScriptedProvider", "SimulatedModel", "SummarizerCall", "conversation",
        "drain",
    ],
    "cmdc.tokens": [
        "TokenCounter", "estimate_message_tokens", "estimate_text_tokens", "estimate_tokens_from_messages",
    ],
    "cmdc.tools": [
        "Tool", "ToolSet", "ToolSource", "tool", "tool_from_schema",
    ],
    "cmdc.tracing": [
        "NO_SPAN", "Span", "Tracer", "UNTRACED",
    ],
    "cmdc.ui": [
        "EXTRA_HINT", "serve_runtime", "serve_store",
    ],
}
# fmt: on

OPTIONAL = {"cmdc.mcp": "mcp", "cmdc.otel": "opentelemetry", "cmdc.ray": "ray"}
"""Public modules on an extra, and the dependency that extra brings."""

UNDECIDED = {"agent", "bus", "checkpoint", "cluster", "offload", "postgres"}
"""Not pinned on purpose: `cmdc.agent`, `cmdc.bus`, `cmdc.offload`, `cmdc.postgres` and
`cmdc.checkpoint` are the old paths kept as aliases of the implementation modules that moved into
`cmdc.runtime` and `cmdc.store` (their public names are pinned there and in `cmdc`), and
`cmdc.cluster` is the implementation behind `cmdc.ray` (pinned above)."""

FACES = {"cli"}
"""The `cmdc` command's module (pyproject's script `cmdc.cli:main`), not an API."""


def _public(module: str) -> ModuleType:
    if module in OPTIONAL:
        pytest.importorskip(OPTIONAL[module], reason=f"{module} needs its extra")
    return importlib.import_module(module)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_pinned_and_resolves(module: str) -> None:
    mod = _public(module)
    names = list(mod.__all__)
    assert len(set(names)) == len(names), f"{module}.__all__ names one twice"
    added, removed = sorted(set(names) - set(PUBLIC[module])), sorted(set(PUBLIC[module]) - set(names))
    assert (added, removed) == ([], []), f"{module}.__all__ changed: pin it here on purpose"
    for name in names:
        assert getattr(mod, name, None) is not None, f"{module}.{name} is in __all__ but does not resolve"
        assert not name.startswith("_") or name == "__version__", f"{module} exports a private name {name}"


def test_a_module_is_public_or_private_on_purpose() -> None:
    """Every module and package at the top of `cmdc/` without a leading underscore has its
    names pinned above (or is named as the command's, or as one being taken apart)."""
    root = Path(cmdc.__file__).parent
    tops = {p.stem for p in root.glob("*.py")} | {p.parent.name for p in root.glob("*/__init__.py")}
    public = {t for t in tops if not t.startswith("_")}
    pinned = {m.split(".")[1] for m in PUBLIC if "." in m}
    assert public - pinned - UNDECIDED - FACES == set()
    assert pinned <= public and not (pinned & (UNDECIDED | FACES))


def test_the_private_modules_stay_private() -> None:
    """Modules that were public by accident before issue 25 are gone under their old names;
    their names live on where users import them."""
    for old in ("groups", "report", "synthetic", "compact_tool", "rehydrate"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"cmdc.{old}")
    testing = importlib.import_module("cmdc.testing")
    assert callable(testing.conversation) and callable(cmdc.compact_context_tool)
    assert cmdc.CompactionReport is importlib.import_module("cmdc.compaction").CompactionReport
    assert issubclass(cmdc.RehydrateReads, cmdc.Plugin)


def test_the_public_api_tests_import_no_private_names() -> None:
    """The tests of the public surface (this directory) use cmdc as a user does: no underscored
    module or name of cmdc is imported (tests of internals live beside their package's tests)."""
    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cmdc":
                names = [*node.module.split("."), *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [part for a in node.names if a.name.split(".")[0] == "cmdc" for part in a.name.split(".")]
            else:
                continue
            if any(n.startswith("_") and not n.startswith("__") for n in names):
                found.append(f"{path.name}:{node.lineno}")
    assert not found


def test_postgres_store_is_imported_on_first_use_and_names_its_extra() -> None:
    """`cmdc.store.PostgresStore` (the documented home; before, only the old alias `cmdc.postgres`
    held it): `import cmdc.store` works without psycopg, and the name then says what to install."""
    code = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import cmdc.store\n"
        "try:\n    cmdc.store.PostgresStore\nexcept ImportError as e:\n    print(e)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert "cmdc.store.PostgresStore needs the 'postgres' extra" in done.stdout, done.stdout + done.stderr
    assert "pip install -e '.[postgres]'" in done.stdout

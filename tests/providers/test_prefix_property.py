"""The stable prefix (docs/design.md: "Cache-friendly"): over a long simulated agent session through a
real HTTP provider, every request's serialised messages are a byte-identical prefix of the next
request's, except across a compaction or a mask batch; each of those is counted and frees at
least the minimum gain; a warm-cache summarizer request extends the last agent request."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import cmdc
from cmdc import tool
from cmdc.compaction.config import CompactConfig
from cmdc.providers import AnthropicProvider, OpenAIProvider
from cmdc.testing import drain
from cmdc.tokens import estimate_text_tokens
from tests._support.fakes import STRUCTURED

TRIGGER = 6_000


@tool
async def read_file(path: str) -> str:
    """Read a file.

    Args:
        path: The file.
    """
    name, _, size = path.partition("#")
    return f"contents of {name}\n" + "\n".join(f"line {i}: {'x' * 40}" for i in range(int(size or 1)))


class Server:
    """Answers the provider's requests: tool calls as the turn's plan says, text otherwise, a
    structured summary to a summarizer request; records every body."""

    def __init__(self, api: str, plan: list[list[int]]) -> None:
        self.api = api
        self.plan = plan
        self.agent: list[dict[str, Any]] = []
        self.summaries: list[tuple[int, dict[str, Any]]] = []  # (agent requests before it, body)
        self.calls = itertools.count(1)
        self.turn = -1
        self.step = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        size = estimate_text_tokens(request.content.decode())
        if summarizing(body):
            self.summaries.append((len(self.agent), body))
            return self.reply(STRUCTURED, [], size)
        self.agent.append(body)
        last = body["messages"][-1]
        if last["role"] == "user" and not tool_results(last):  # a new turn
            self.turn, self.step = self.turn + 1, 0
        sizes = self.plan[self.turn] if 0 <= self.turn < len(self.plan) else []
        if self.step < len(sizes):
            n = next(self.calls)
            self.step += 1
            return self.reply("", [(f"call_{n}", {"path": f"src/f{n}.py#{sizes[self.step - 1]}"})], size)
        return self.reply(f"answer {self.turn}: " + "the parser is fixed. " * 8, [], size)

    def reply(self, text: str, calls: list[tuple[str, dict[str, Any]]], prompt: int) -> httpx.Response:
        if self.api == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": orjson.dumps(a).decode()},
                    }
                    for i, a in calls
                ]
            usage = {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
            return httpx.Response(200, json={"choices": [choice], "usage": usage})
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [{"type": "tool_use", "id": i, "name": "read_file", "input": a} for i, a in calls]
        usage = {"input_tokens": prompt, "output_tokens": 20}
        stop = "tool_use" if calls else "end_turn"
        return httpx.Response(200, json={"type": "message", "content": content, "stop_reason": stop, "usage": usage})


def tool_results(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return message["role"] == "tool" or (
        isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
    )


INSTRUCTIONS = "You fix parsers."


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    if system is None and body["messages"][0]["role"] == "system":
        system = body["messages"][0]["content"]
    if isinstance(system, list):
        return "".join(b["text"] for b in system)
    return system or ""


def last_text(body: dict[str, Any]) -> str:
    """The text of the last message's last block: Anthropic merges consecutive user messages, so
    a warm summarizer request made before a turn's first model call has the instruction as the
    last block of the user's prompt (`[prompt, instruction]`), not as a message of its own."""
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return str(content[-1].get("text", "")) if content else ""


def summarizing(body: dict[str, Any]) -> bool:
    """A summarizer request: warm (the instruction last) or cold (its own system prompt)."""
    return warm(body) or system_text(body) != INSTRUCTIONS


def warm(body: dict[str, Any]) -> bool:
    return last_text(body).startswith("[Context compaction]")


def prefix_bytes(api: str, body: dict[str, Any]) -> bytes:
    """What the provider's cache matches: OpenAI the messages' bytes; Anthropic the system, the
    tools and then the content blocks in order (its breakpoints, `cache_control`, are markers,
    not content, and a turn's blocks grow when messages are merged into it)."""
    if api == "openai":
        return orjson.dumps(body["messages"])[:-1]  # without the closing bracket

    def bare(block: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in block.items() if k != "cache_control"}

    system = body.get("system", "")
    head = [bare(b) for b in system] if isinstance(system, list) else system
    out = orjson.dumps([head, [bare(t) for t in body.get("tools", [])]])
    for m in body["messages"]:
        for b in m["content"]:
            out += orjson.dumps([m["role"], bare(b)]) + b"\n"
    return out


async def session(tmp_path: Path, api: str, plan: list[list[int]]) -> tuple[Server, list[Any]]:
    server = Server(api, plan)
    client = httpx.AsyncClient(transport=httpx.MockTransport(server.handle))
    if api == "openai":
        model: Any = OpenAIProvider("m", base_url="http://model.test/v1", client=client)
    else:
        model = AnthropicProvider("m", base_url="http://model.test", client=client)
    config = {
        "compact_offload_dir": str(tmp_path),
        "compact_trigger": ("tokens", TRIGGER),
        "context_window": 16_000,
        "compact_keep": ("messages", 4),
        "tool_result_limit": 1_000,
    }
    async with client, cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a", model, instructions=INSTRUCTIONS, tools=[read_file], config=config)
        with rt.subscribe("a", buffer=100_000) as sub:
            for i in range(len(plan)):
                with trio.fail_after(30):
                    await agent.prompt(f"step {i}: look at the parser again, " + "please " * (i % 5))
            events = drain(sub)
    return server, events


turns = st.lists(st.lists(st.integers(1, 60), max_size=3), min_size=12, max_size=30)


def check(api: str, server: Server, events: list[Any]) -> None:
    gain = CompactConfig.from_mapping({"compact_trigger": ("tokens", TRIGGER)}).tiers.gain(TRIGGER)
    # the changes between consecutive agent requests, from the events' order
    changes: list[list[Any]] = []
    for e in events:
        if e.kind == "request":
            changes.append([])
        elif e.kind in ("compaction_end", "tool_results_masked") and changes:
            changes[-1].append(e)
    assert len(changes) == len(server.agent)
    breaks = 0
    for i in range(1, len(server.agent)):
        before, after = prefix_bytes(api, server.agent[i - 1]), prefix_bytes(api, server.agent[i])
        between = changes[i - 1]  # made after request i-1's reply, before request i
        if not after.startswith(before):
            breaks += 1
            assert between, f"request {i} does not extend request {i - 1}, and nothing changed the context between"
        for e in between:
            freed = (
                e.data["freed"]
                if e.kind == "tool_results_masked"
                else (e.data["report"].tokens_before - e.data["report"].tokens_after)
            )
            assert freed >= gain, f"a {e.kind} freed {freed} tokens, under the minimum gain {gain}"
    assert breaks <= sum(len(c) for c in changes)
    for n, body in server.summaries:  # warm: on the agent's prefix
        if warm(body):
            assert prefix_bytes(api, body).startswith(prefix_bytes(api, server.agent[n - 1]))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=turns)
def test_requests_extend_each_other_between_changes_openai(tmp_path_factory: Any, plan: list[list[int]]) -> None:
    server, events = trio.run(session, tmp_path_factory.mktemp("p"), "openai", plan)
    check("openai", server, events)


# a compaction before a turn's first model call: the warm request's instruction is merged into the prompt's turn
BEFORE_A_TURN = [[1, 1], [1, 1, 1], [1, 1, 1], [], [1, 1, 1], *[[]] * 12, [1, 1, 1], [1, 1], [1, 1, 1], [1], [1]]
BEFORE_A_TURN += [[9, 18], [1, 1, 20], [], [52], [], [], [56], []]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=turns)
@example(plan=BEFORE_A_TURN)
def test_requests_extend_each_other_between_changes_anthropic(tmp_path_factory: Any, plan: list[list[int]]) -> None:
    server, events = trio.run(session, tmp_path_factory.mktemp("p"), "anthropic", plan)
    check("anthropic", server, events)


def test_a_long_session_compacts_and_masks_and_stays_a_prefix(tmp_path: Path) -> None:
    """The same check on one fixed long session that surely compacts and masks."""
    plan = [[40, 50, 60] if i % 2 else [] for i in range(30)]
    server, events = trio.run(session, tmp_path, "openai", plan)
    kinds = [e.kind for e in events]
    assert "compaction_end" in kinds and "tool_results_masked" in kinds
    assert server.summaries and all(warm(b) for _, b in server.summaries)
    check("openai", server, events)
    breaks = sum(
        not prefix_bytes("openai", b).startswith(prefix_bytes("openai", a)) for a, b in itertools.pairwise(server.agent)
    )
    changes = kinds.count("compaction_end") + kinds.count("tool_results_masked")
    assert 1 <= breaks <= changes < len(server.agent)

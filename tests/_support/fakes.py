"""Fakes internal to cmdc's own tests: a scripted summarizing model, an adding model and its
tool, State and config builders, an HTTP endpoint with the OpenAI and Anthropic replies and SSE
bodies it scripts, conversations with tool calls (builders, the pair check, a hypothesis
strategy), and journal-file helpers. The fakes a user's tests want too (the recording
summarizer, `drain`, scripted and simulated models, synthetic conversations) are public, in
`cmdc.testing`."""

from __future__ import annotations

import itertools
import os
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio
from hypothesis import strategies as st

import cmdc
import cmdc.offload as offload
from cmdc import ImagePart, Message, State, TextPart, TokenUsage, ToolCall, tool
from cmdc.message import PINNED_KEY
from cmdc.providers import ModelRequest, ToolSchema
from cmdc.providers.base import STOP_REASON_KEY

SECTIONS = [
    "Primary request and intent",
    "Key concepts",
    "Files and code",
    "Errors and fixes",
    "All user messages",
    "Pending tasks",
    "Current work",
    "Next step",
]
"""The sections the default summary prompt asks for (written here from the prompt, not read
from the code that checks them)."""
STRUCTURED = "\n".join(f"## {name}\n- noted" for name in SECTIONS)
"""A summary with every section."""


class ScriptedSummaryModel:
    """A summarizing model (a provider) that answers `(text, stop reason)` pairs in order (the
    last one repeats) and records every request."""

    def __init__(self, *answers: tuple[str, str]) -> None:
        self.answers = list(answers)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> Message:
        self.requests.append(request)
        text, stop = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        usage = TokenUsage(input_tokens=1, output_tokens=1)
        return Message.assistant(text, usage=usage, metadata={STOP_REASON_KEY: stop})


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    await trio.lowlevel.checkpoint()
    return a + b


_call_ids = itertools.count(1)


class Adder:
    """A deterministic model for `add`: on a user message it calls `add` with the last two
    numbers of the latest message that holds two, then answers `answer: <the tool's result>`;
    asked to summarize, it answers a short summary. Its replies report usage, and its calls
    carry some words, so that a summary of old turns is smaller than they are. Call ids are
    unique in the process (a restarted agent's new model never reuses an old one)."""

    THINKING = "I will add the two numbers with the add tool, then report the sum. " * 4

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> Message:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        usage = TokenUsage(input_tokens=cmdc.estimate_tokens_from_messages(request.messages), output_tokens=5)
        if request.metadata.get("cmdc.purpose") == "summarize":
            return Message.assistant("summary of earlier turns", usage=usage)
        last = request.messages[-1]
        if last.role == "user":
            asked = next(m for m in reversed(request.messages) if len(re.findall(r"\d+", m.text)) >= 2)
            a, b = map(int, re.findall(r"\d+", asked.text)[-2:])
            call = ToolCall(id=f"add{next(_call_ids)}", name="add", arguments={"a": a, "b": b})
            return Message.assistant(self.THINKING, tool_calls=(call,), usage=usage)
        return Message.assistant(f"answer: {last.text}", usage=usage)


def grow(state: State, round_no: int, size: int = 300) -> State:
    """`state` and one more round: a user message, a read_file call and its result, an answer
    (`size` characters in the question and in the result; call ids unique within the state)."""
    call = ToolCall(
        id=f"c{round_no}-{len(state.messages)}", name="read_file", arguments={"path": f"src/f{round_no}.py"}
    )
    return state.append(
        Message.user(f"round {round_no}: " + "u" * size),
        Message.assistant("", tool_calls=(call,)),
        Message.tool_result(call.id, f"contents {round_no} " + "r" * size),
        Message.assistant(f"done with round {round_no}"),
    )


def make_state(offload: Path, messages: Sequence[Message] = (), *, agent_id: str = "a1", **config: Any) -> State:
    """A State of `messages` whose journal goes to the directory `offload`, with `config`."""
    return State(agent_id=agent_id, messages=messages, config={"compact_offload_dir": str(offload), **config})


def sse(*events: Any, event_names: bool = False) -> bytes:
    """An SSE body, one event per item: a dict becomes `data: <json>`, a str or bytes is sent as
    the data verbatim; with `event_names`, a dict's `type` is named in an `event:` line."""
    out = []
    for e in events:
        data = e if isinstance(e, bytes) else e.encode() if isinstance(e, str) else orjson.dumps(e)
        name = f"event: {e['type']}\n".encode() if event_names and isinstance(e, dict) else b""
        out.append(name + b"data: " + data + b"\n\n")
    return b"".join(out)


# -- an HTTP endpoint and the replies it scripts (the OpenAI and Anthropic wire formats) ---------------


async def serve_loopback(nursery: trio.Nursery, serve: Callable[[trio.SocketStream], Any]) -> str:
    """Start `serve` as a TCP server on a free loopback port in `nursery`; return an OpenAI
    base URL pointing at it."""
    listeners = await nursery.start(trio.serve_tcp, serve, 0)
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def read_head(stream: trio.SocketStream) -> bytes:
    """Read from `stream` until a whole HTTP request head has arrived; return what was read."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    return data


Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]] | BaseException | Callable[[httpx.Request], httpx.Response]


def _response(answer: Answer, request: httpx.Request) -> httpx.Response:
    if isinstance(answer, BaseException):
        raise answer
    if callable(answer):
        return answer(request)
    status, body, *rest = answer
    headers = rest[0] if rest else {}
    if isinstance(body, (dict, list)):
        return httpx.Response(status, json=body, headers=headers)
    content = body.encode() if isinstance(body, str) else body
    return httpx.Response(status, content=content, headers=headers)


class Endpoint:
    """A MockTransport handler answering requests in order (the last answer repeats) and
    recording every request with the trio time it arrived."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(trio.current_time())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return _response(answer, request)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))

    def bodies(self) -> list[dict[str, Any]]:
        return [orjson.loads(r.content) for r in self.requests]


SSE = {"content-type": "text/event-stream"}


def openai_reply(text: Any = "done", **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    message.update(extra)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-test",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in extra else "stop"}
        ],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    }


def anthropic_reply(*content: dict[str, Any], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content) or [{"type": "text", "text": "done"}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "cache_creation_input_tokens": 20,
            "cache_read_input_tokens": 300,
            "output_tokens": 50,
        },
    }


SEARCH = ToolSchema(
    "search", "Search the web.", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
)


READ = ToolSchema("read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})


def openai_chunks(text: str) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": ch}) for ch in (text[:2], text[2:])),
        chunk({}, "stop"),
        {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 9,
         "completion_tokens": 2, "total_tokens": 11}},
    ]  # fmt: skip


def anthropic_events(*, stop: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-test",
                "stop_reason": None,
                "usage": {
                    "input_tokens": 100,
                    "cache_creation_input_tokens": 20,
                    "cache_read_input_tokens": 300,
                    "output_tokens": 1,
                },
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}},
        },
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"q": "tr'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": 'io"}'}},
        {"type": "content_block_stop", "index": 1},
        # cumulative usage: each message_delta replaces the figure before it
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": 40}},
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 55}},
    ]  # fmt: skip
    if stop:
        events.append({"type": "message_stop"})
    return events


# -- an agent's config ---------------------------------------------------------------------------


def agent_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path / "offload"), **extra}


def state_in(tmp_path: Path, messages: Sequence[Message], **config: Any) -> State:
    """`make_state` with the compactor tests' defaults: the journal in tmp_path/offload, four kept."""
    return make_state(tmp_path / "offload", messages, **{"compact_keep": ("messages", 4), **config})


# -- conversations with tool calls ------------------------------------------------------------------


def asst(*call_ids: str, text: str = "") -> Message:
    return Message.assistant(text, tool_calls=tuple(ToolCall(id=c, name="t", arguments={"c": c}) for c in call_ids))


def res(call_id: str, text: str = "ok") -> Message:
    return Message.tool_result(call_id, text)


def check_pairs(kept: Sequence[Message], original: Sequence[Message]) -> None:
    """No kept result lacks its call; no kept call lacks a result that exists in `original`."""
    kept_calls = {c.id for m in kept for c in m.tool_calls}
    kept_results = {m.tool_call_id for m in kept if m.role == "tool"}
    all_results = {m.tool_call_id for m in original if m.role == "tool"}
    assert kept_results <= kept_calls, "a kept tool result lost its call"
    assert (kept_calls & all_results) <= kept_results, "a kept call lost its result"


@st.composite
def conversations(draw: st.DrawFn, orphans: bool = False) -> list[Message]:
    """Conversations with pins, parallel calls answered in any order or not at all, and (with
    `orphans`) results whose call is not in the conversation."""
    ms: list[Message] = [Message.system("s") for _ in range(draw(st.integers(0, 2)))]
    n_calls = 0
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "system"]))
        if kind == "user":
            pin = draw(st.integers(0, 9)) == 0
            ms.append(Message.user("u" * draw(st.integers(0, 300)), metadata={PINNED_KEY: True} if pin else None))
        elif kind == "system":
            ms.append(Message.system("mid"))
        elif kind == "assistant":
            ms.append(Message.assistant("a" * draw(st.integers(0, 300))))
        else:
            ids = [f"c{n_calls + i}" for i in range(draw(st.integers(1, 4)))]
            n_calls += len(ids)
            call = asst(*ids)
            if draw(st.integers(0, 15)) == 0:
                call = call.evolve(metadata={PINNED_KEY: True})
            ms.append(call)
            if orphans and draw(st.integers(0, 10)) == 0:
                ms.append(Message.tool_result("orphan", "a result whose call is not in the conversation"))
            answered = draw(st.lists(st.sampled_from(ids), unique=True))  # any order, any subset
            for cid in answered:
                if draw(st.booleans()):
                    ms.append(Message.user("between"))
                pin = draw(st.integers(0, 15)) == 0
                ms.append(
                    Message.tool_result(
                        cid, "r" * draw(st.integers(0, 200)), metadata={PINNED_KEY: True} if pin else None
                    )
                )
    return ms


# -- journal files -------------------------------------------------------------------------------


REAL_WRITE = os.write


REAL_FSYNC = os.fsync


REAL_OPEN = os.open


REAL_PREAD = os.pread


def is_journal_fd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl")
    except OSError:
        return False


def users(n: int, prefix: str = "message") -> list[Message]:
    return [Message.user(f"{prefix} {i}") for i in range(n)]


def varied() -> list[Message]:
    return [
        Message.system("You are terse.", metadata={"cmdc.pinned": True}),
        Message.user('héllo wörld ✓ 🐍 "quoted" \\ back\nslash\u2028'),
        Message.user((TextPart("look at this"), ImagePart("https://x/y.png", "image/png"))),
        Message.assistant(
            "calling",
            tool_calls=(ToolCall(id="c1", name="search", arguments={"q": "trio", "n": [1, 2.5, None, {"k": True}]}),),
            usage=TokenUsage(input_tokens=10, output_tokens=5),
        ),
        Message.tool_result("c1", "result text", is_error=True, metadata={"nested": {"a": [1, 2]}}),
        Message.assistant("done", metadata={"cmdc.kind": "summary", "big": 2**63}),
        Message.user(""),
    ]


def check_clean(path: Path) -> list[dict[str, Any]]:
    """Every line complete, valid JSON, with a good crc; the first line names the journal;
    message seqs increase. Returns the message records."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    out = []
    last = 0
    lines = data.split(b"\n")[:-1]
    assert lines[0].startswith(b'{"journal":')
    for line in lines:
        obj = orjson.loads(line)
        head = b'{"%s":' % next(iter(obj)).encode()
        assert line.endswith(b',"crc":"%s"}' % obj["crc"].encode())
        assert int(obj["crc"], 16) == zlib.crc32(line[len(head) : -18])
        if "message" not in obj:
            control = (["journal", "follows", "agent", "seq", "ts", "crc"], ["commit", "journal", "seq", "ts", "crc"])
            assert list(obj) in control
            continue
        assert list(obj) == ["message", "compaction", "ts", "seq", "attempt", "journal", "crc"]
        assert obj["seq"] > last
        last = obj["seq"]
        out.append(obj)
    return out


def line(seq: int, message: dict[str, Any] | bytes, compaction: int = 0) -> bytes:
    """One journal record line, as the writer encodes it (`message`: a dict, or raw JSON bytes)."""
    raw = message if isinstance(message, bytes) else orjson.dumps(message)
    return offload._encode_records(seq, compaction, 1.0, [raw])

"""Hostile endpoints: endless streams, lines that never end, huge bodies, tool-call floods,
trickles and retry storms. Each gets a typed `ProviderError` having read a bounded amount
(bodies are generated lazily; the test counts what the endpoint produced), and a neighbour
agent still answers."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from fakes import read_head, serve_loopback

from cmdc import ConfigError, Message, open_runtime
from cmdc.errors import ProviderError, ProviderTimeout, ReplyTooLarge, ServerError, TooManyToolCalls
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider, ReplyLimits, ScriptedProvider

MiB = 1024 * 1024
CHUNK = 64 * 1024


class Lazy(httpx.AsyncByteStream):
    """A response body made on demand from `chunks`, counting the bytes handed out."""

    def __init__(self, chunks: Iterator[bytes], pause: float = 0.0) -> None:
        self.chunks = chunks
        self.pause = pause
        self.produced = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.produced += len(chunk)
            yield chunk
            if self.pause:
                await trio.sleep(self.pause)
            else:
                await trio.lowlevel.checkpoint()


def forever(chunk: bytes) -> Iterator[bytes]:
    while True:
        yield chunk


def serving(body: Lazy, status: int = 200, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, stream=body, headers=headers or {"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def delta(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


REQUEST = ModelRequest([Message.user("hi")])
Make = Callable[..., OpenAIProvider | AnthropicProvider]
KINDS: list[Make] = [
    lambda **kw: OpenAIProvider("m", api_key="k", max_retries=0, **kw),
    lambda **kw: AnthropicProvider("c", api_key="k", max_retries=0, **kw),
]


async def neighbour_answers(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        ref = await rt.spawn("neighbour", ScriptedProvider(["pong"]), config={"compact_offload_dir": str(tmp_path)})
        await ref.ping()
        assert (await ref.prompt("ping")).text == "pong"


@pytest.mark.parametrize("make", KINDS)
async def test_an_endless_stream_of_deltas_is_cut_at_max_reply_bytes(make: Make) -> None:
    body = Lazy(forever(delta("more " * 40)))
    provider = make(stream=True, client=serving(body), limits=ReplyLimits(max_reply_bytes=MiB))
    with pytest.raises(ReplyTooLarge, match="max_reply_bytes"):
        await provider.complete(REQUEST)
    assert MiB < body.produced <= MiB + CHUNK


@pytest.mark.parametrize("make", KINDS)
async def test_a_line_that_never_ends_is_cut_at_max_line_bytes(make: Make) -> None:
    """At the default limits: the provider holds about 4 MiB of the line, never the rest."""
    body = Lazy(itertools.chain([b"data: "], forever(b"x" * CHUNK)))
    provider = make(stream=True, client=serving(body))
    with pytest.raises(ReplyTooLarge, match="max_line_bytes"):
        await provider.complete(REQUEST)
    assert body.produced <= ReplyLimits().max_line_bytes + 2 * CHUNK


@pytest.mark.parametrize("make", KINDS)
async def test_a_200_mb_json_reply_is_refused_after_the_limit(make: Make) -> None:
    chunks = (b"x" * CHUNK for _ in range(200 * MiB // CHUNK))
    body = Lazy(itertools.chain([b'{"choices": "'], chunks))
    provider = make(client=serving(body, headers={"content-type": "application/json"}))
    with pytest.raises(ReplyTooLarge, match="max_reply_bytes"):
        await provider.complete(REQUEST)
    assert body.produced <= ReplyLimits().max_reply_bytes + 2 * CHUNK
    # a declared length past the limit is refused before a byte of the body is read
    declared = Lazy(forever(b"x" * CHUNK))
    headers = {"content-type": "application/json", "content-length": str(200 * MiB)}
    provider = make(client=serving(declared, headers=headers))
    with pytest.raises(ReplyTooLarge, match=f"{200 * MiB} bytes"):
        await provider.complete(REQUEST)
    assert declared.produced == 0


async def test_a_huge_error_body_is_read_only_as_far_as_classifying_needs() -> None:
    body = Lazy(forever(b"e" * CHUNK))
    provider = OpenAIProvider("m", max_retries=0, client=serving(body, status=500))
    with pytest.raises(ServerError):
        await provider.complete(REQUEST)
    assert body.produced <= 2 * CHUNK


def openai_calls(n: int) -> dict[str, Any]:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "t", "arguments": "{}"}} for i in range(n)]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def anthropic_calls(n: int) -> dict[str, Any]:
    content = [{"type": "tool_use", "id": f"t{i}", "name": "t", "input": {}} for i in range(n)]
    return {"type": "message", "role": "assistant", "content": content, "stop_reason": "tool_use", "usage": {}}


def openai_call_stream(n: int) -> Iterator[bytes]:
    for i in range(n):
        fragment = {"index": i, "id": f"c{i}", "function": {"name": "t", "arguments": "{}"}}
        yield b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]}) + b"\n\n"
    yield b"data: [DONE]\n\n"


def anthropic_call_stream(n: int) -> Iterator[bytes]:
    for i in range(n):
        block = {"type": "tool_use", "id": f"t{i}", "name": "t", "input": {}}
        yield b"data: " + orjson.dumps({"type": "content_block_start", "index": i, "content_block": block}) + b"\n\n"
    yield b'data: {"type": "message_stop"}\n\n'


@pytest.mark.parametrize(
    ("make", "reply", "stream"),
    [
        (KINDS[0], openai_calls, openai_call_stream),
        (KINDS[1], anthropic_calls, anthropic_call_stream),
    ],
)
async def test_a_flood_of_tool_calls_is_refused(
    make: Make, reply: Callable[[int], dict[str, Any]], stream: Callable[[int], Iterator[bytes]]
) -> None:
    limits = ReplyLimits(max_tool_calls=50)
    ok = Lazy(iter([orjson.dumps(reply(50))]))
    assert len((await make(client=serving(ok), limits=limits).complete(REQUEST)).tool_calls) == 50
    flood = Lazy(iter([orjson.dumps(reply(10_000))]))
    with pytest.raises(TooManyToolCalls, match="more than 50 tool calls"):
        await make(client=serving(flood), limits=limits).complete(REQUEST)
    body = Lazy(stream(10_000))
    with pytest.raises(TooManyToolCalls):
        await make(stream=True, client=serving(body), limits=limits).complete(REQUEST)
    assert body.produced < 60 * 200  # refused at the 51st call, not at the end of the stream


@pytest.mark.parametrize("make", KINDS)
async def test_a_trickle_that_never_ends_is_cut_at_max_stream_seconds(make: Make, autojump_clock: Any) -> None:
    """One keep-alive comment a second: httpx's read timeout never fires; the stream bound does."""
    body = Lazy(forever(b": keep-alive\n"), pause=1.0)
    provider = make(stream=True, client=serving(body), limits=ReplyLimits(max_stream_seconds=120))
    start = trio.current_time()
    with pytest.raises(ProviderTimeout, match="max_stream_seconds=120"):
        await provider.complete(REQUEST)
    assert trio.current_time() - start == pytest.approx(120, abs=2)


async def test_the_overall_deadline_bounds_retries(autojump_clock: Any) -> None:
    requests: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(trio.current_time())
        return httpx.Response(503, json={"error": {"message": "busy"}})

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    provider = OpenAIProvider("m", max_retries=1_000, client=client, deadline=60)
    with pytest.raises(ProviderTimeout, match="deadline of 60"):
        await provider.complete(REQUEST)
    assert len(requests) > 3 and requests[-1] < 60
    assert OpenAIProvider("m", api_key="k").deadline == 900.0


def test_limits_are_checked() -> None:
    for bad in ({"max_reply_bytes": 0}, {"max_line_bytes": True}, {"max_tool_calls": 1.5}, {"max_stream_seconds": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ReplyLimits(**bad)
    with pytest.raises(ConfigError, match="limits"):
        OpenAIProvider("m", limits={"max_reply_bytes": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="deadline"):
        AnthropicProvider("m", deadline=-1)


async def test_lines_split_on_lf_crlf_and_cr_across_chunks() -> None:
    """The bounded line splitter keeps SSE's three line endings, even cut between chunks."""
    events = [
        b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\r',
        b'\n\r\ndata: {"choices": [{"index": 0, "delta": {"content": "b"}}]}\r\r',
        b'data: {"choices": [{"index": 0, "delta": {"content": "c"}}]}\n',
        b'\ndata: {"choices": [{"index": 0, "delta": {"content": "\xc3',
        b'\xa9"}, "finish_reason": "stop"}]}\r\n\r\ndata: [DONE]',
    ]
    provider = OpenAIProvider("m", stream=True, client=serving(Lazy(iter(events))))
    assert (await provider.complete(REQUEST)).text == "abcé"


async def test_an_agent_on_an_endless_stream_gets_a_typed_error_and_its_neighbour_answers(tmp_path: Path) -> None:
    body = Lazy(forever(delta("more " * 40)))
    provider = OpenAIProvider(
        "m", stream=True, max_retries=0, client=serving(body), limits=ReplyLimits(max_reply_bytes=MiB)
    )
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("victim", provider, config={"compact_offload_dir": str(tmp_path)})
        neighbour = await rt.spawn(
            "neighbour", ScriptedProvider(["pong"]), config={"compact_offload_dir": str(tmp_path)}
        )
        async with trio.open_nursery() as nursery:

            async def attacked() -> None:
                with pytest.raises(ProviderError):
                    await agent.prompt("hi")

            nursery.start_soon(attacked)
            await neighbour.ping()
            assert (await neighbour.prompt("ping")).text == "pong"
        assert agent.running


async def test_a_line_that_never_ends_over_loopback(tmp_path: Path) -> None:
    """A real socket: the server keeps sending one line; the client stops at the limit and
    closes the connection."""
    closed = trio.Event()
    sent = 0

    async def serve(stream: trio.SocketStream) -> None:
        nonlocal sent
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ")
        try:
            while True:
                await stream.send_all(b"y" * CHUNK)
                sent += CHUNK
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            closed.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            base_url = await serve_loopback(nursery, serve)
            async with httpx.AsyncClient(trust_env=False) as client:
                provider = OpenAIProvider(
                    "m",
                    base_url=base_url,
                    stream=True,
                    max_retries=0,
                    client=client,
                    limits=ReplyLimits(max_line_bytes=MiB),
                )
                with pytest.raises(ReplyTooLarge, match="max_line_bytes"):
                    await provider.complete(REQUEST)
            await closed.wait()
            nursery.cancel_scope.cancel()
    await neighbour_answers(tmp_path)

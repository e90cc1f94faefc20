"""The HTTP providers under cancellation: a cancelled stream closes its response and leaves no
connection behind; clients are closed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio
from fakes import (
    anthropic_events,
    openai_chunks,
    read_head,
    serve_loopback,
    sse,
)

from cmdc import Message
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider


class StallingStream(httpx.AsyncByteStream):
    """A response body that sends one chunk, then waits forever; records whether it was closed."""

    def __init__(self, first: bytes) -> None:
        self.first = first
        self.sent = trio.Event()
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        self.sent.set()
        await trio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_cancelling_a_stream_midway_closes_the_response(kind: str) -> None:
    if kind == "openai":
        body = StallingStream(sse(openai_chunks("hello")[0]))
    else:
        body = StallingStream(sse(*anthropic_events()[:3], event_names=True))
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=body)))
    provider: OpenAIProvider | AnthropicProvider
    if kind == "openai":
        provider = OpenAIProvider("m", stream=True, client=client)
    else:
        provider = AnthropicProvider("c", api_key="k", stream=True, client=client)
    async with trio.open_nursery() as nursery:

        async def cancel_midway() -> None:
            await body.sent.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(cancel_midway)
        await provider.complete(ModelRequest([Message.user("go")]))
    assert body.sent.is_set() and body.closed


async def test_cancelling_a_stream_leaves_no_open_connection_in_the_pool() -> None:
    """A loopback HTTP server streams a reply and stalls; cancelling the request closes the
    connection (the server sees EOF) and the client's pool holds no connection."""
    sent, eof = trio.Event(), trio.Event()

    async def serve(stream: trio.SocketStream) -> None:
        await read_head(stream)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        chunk = sse(openai_chunks("hello")[0])
        await stream.send_all(head + b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sent.set()
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        eof.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            base_url = await serve_loopback(nursery, serve)
            async with httpx.AsyncClient(trust_env=False) as client:
                provider = OpenAIProvider("m", base_url=base_url, stream=True, client=client)
                with trio.CancelScope() as scope:

                    async def cancel_midway() -> None:
                        await sent.wait()
                        await trio.sleep(0.05)
                        scope.cancel()

                    nursery.start_soon(cancel_midway)
                    await provider.complete(ModelRequest([Message.user("go")]))
                assert scope.cancelled_caught
                await eof.wait()
                pool = client._transport._pool  # type: ignore[attr-defined]
                assert pool.connections == []
            nursery.cancel_scope.cancel()


async def test_a_finished_stream_returns_its_connection_to_the_pool() -> None:
    """Two streamed replies over one keep-alive connection of a loopback server."""
    requests_per_connection: list[int] = []

    async def serve(stream: trio.SocketStream) -> None:
        buffer, served = b"", 0
        requests_per_connection.append(0)
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            served += 1
            requests_per_connection[-1] = served
            body = sse(*openai_chunks(f"reply {served}"), "[DONE]")
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            )

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            base_url = await serve_loopback(nursery, serve)
            async with httpx.AsyncClient(trust_env=False) as client:
                provider = OpenAIProvider("m", base_url=base_url, stream=True, client=client)
                first = await provider.complete(ModelRequest([Message.user("one")]))
                second = await provider.complete(ModelRequest([Message.user("two")]))
            nursery.cancel_scope.cancel()
    assert (first.text, second.text) == ("reply 1", "reply 2")
    assert requests_per_connection == [2]


async def test_owned_client_is_closed_by_aclose() -> None:
    provider = OpenAIProvider("m", api_key="k")
    client = provider._http()
    async with provider:
        pass
    assert client.is_closed
    assert provider._http() is not client  # made again on the next use
    await provider.aclose()

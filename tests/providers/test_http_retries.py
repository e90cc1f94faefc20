"""The HTTP providers' retries: Retry-After, backoff, errors never retried, overload storms,
connection errors, a lowered output budget."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from fakes import (
    Endpoint,
    anthropic_reply,
    openai_reply,
)

from cmdc import ContextOverflow, Message
from cmdc.errors import (
    AuthError,
    BadRequest,
    ConnectionFailed,
    OutputBudgetOverflow,
    Overloaded,
    QuotaExceeded,
    RateLimited,
)
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider
from cmdc.providers.base import CONTEXT_EXCEEDED_KEY, OUTPUT_REDUCED_KEY


def openai_error(status: int, message: str, code: str | None = None, type_: str = "invalid_request_error") -> Any:
    return (status, {"error": {"message": message, "type": type_, "param": None, "code": code}})


async def test_429_with_retry_after_then_200_waits_the_advertised_time(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(
        (429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}, {"retry-after": "7"}),
        (200, openai_reply("after the wait")),
    )
    provider = OpenAIProvider("m", client=endpoint.client())
    start = trio.current_time()
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "after the wait"
    assert len(endpoint.requests) == 2
    assert endpoint.times[1] - endpoint.times[0] >= 7.0
    assert trio.current_time() - start >= 7.0


async def test_retry_after_ms_and_backoff_for_anthropic(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(
        (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, {"retry-after-ms": "2500"}),
        (500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
        (200, anthropic_reply()),
    )
    provider = AnthropicProvider("claude-test", api_key="k", client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "done" and len(endpoint.requests) == 3
    assert endpoint.times[1] - endpoint.times[0] >= 2.5
    assert endpoint.times[2] > endpoint.times[1]  # backoff before the 5xx retry


async def test_retry_after_beyond_the_cap_is_not_waited(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(
        (429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}}, {"retry-after": "3600"})
    )
    provider = OpenAIProvider("m", client=endpoint.client())
    with pytest.raises(RateLimited) as info:
        await provider.complete(ModelRequest([Message.user("go")]))
    assert info.value.retry_after == 3600.0 and len(endpoint.requests) == 1


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (openai_error(401, "Incorrect API key provided", code="invalid_api_key"), AuthError),
        (openai_error(403, "Project does not have access", type_="permission_error"), AuthError),
        (openai_error(429, "You exceeded your current quota", code="insufficient_quota"), QuotaExceeded),
        (openai_error(400, "Invalid schema for function 'search'", code="invalid_function_parameters"), BadRequest),
        (openai_error(400, "prompt is too long: 210000 tokens > 200000 maximum"), ContextOverflow),
    ],
    ids=["401", "403", "quota", "bad request", "overflow"],
)
async def test_errors_that_are_never_retried(
    answer: Any, error: type[Exception], autojump_clock: trio.abc.Clock
) -> None:
    endpoint = Endpoint(answer, (200, openai_reply()))
    provider = OpenAIProvider("m", client=endpoint.client())
    start = trio.current_time()
    with pytest.raises(error):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert len(endpoint.requests) == 1  # failed at once
    assert trio.current_time() == start


async def test_a_529_storm_ends_in_overloaded_after_the_retry_budget(autojump_clock: trio.abc.Clock) -> None:
    storm = (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    endpoint = Endpoint(storm)
    provider = AnthropicProvider("claude-test", api_key="k", max_retries=3, client=endpoint.client())
    with pytest.raises(Overloaded) as info:
        await provider.complete(ModelRequest([Message.user("go")]))
    assert info.value.status == 529
    assert len(endpoint.requests) == 1 + 3  # the first attempt and max_retries retries
    gaps = [b - a for a, b in zip(endpoint.times, endpoint.times[1:], strict=False)]
    assert all(gap > 0 for gap in gaps)  # backoff between attempts

    none = AnthropicProvider("claude-test", api_key="k", max_retries=0, client=Endpoint(storm).client())
    with pytest.raises(Overloaded):
        await none.complete(ModelRequest([Message.user("go")]))


async def test_connection_errors_are_retried(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(httpx.ConnectError("connection refused"), (200, openai_reply("back")))
    provider = OpenAIProvider("m", client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "back" and len(endpoint.requests) == 2

    down = Endpoint(httpx.ReadTimeout("timed out"))
    provider = OpenAIProvider("m", max_retries=1, client=down.client())
    with pytest.raises(ConnectionFailed, match="ReadTimeout"):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert len(down.requests) == 2


async def test_output_budget_overflow_is_retried_once_with_a_lower_limit(autojump_clock: trio.abc.Clock) -> None:
    budget = (
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": "input length and `max_tokens` "
         "exceed context limit: 190000 + 20000 > 200000, decrease input length or `max_tokens` and try again"}},
    )  # fmt: skip
    endpoint = Endpoint(budget, (200, anthropic_reply()))
    provider = AnthropicProvider("claude-test", api_key="k", max_output_tokens=20000, client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert [b["max_tokens"] for b in endpoint.bodies()] == [20000, 10000]
    assert reply.metadata[OUTPUT_REDUCED_KEY] == 10000
    assert reply.metadata[CONTEXT_EXCEEDED_KEY] is True  # compact before the next step

    # twice over budget: the second error reaches the caller (an overflow: the agent compacts)
    endpoint = Endpoint(budget)
    provider = AnthropicProvider("claude-test", api_key="k", max_output_tokens=20000, client=endpoint.client())
    with pytest.raises(OutputBudgetOverflow):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert len(endpoint.requests) == 2

    # too little room left for a useful answer: no retry, compaction is the remedy
    tight = openai_error(
        400,
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the "
        "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
    )
    endpoint = Endpoint(tight)
    openai = OpenAIProvider("m", max_output_tokens=1000, client=endpoint.client())
    with pytest.raises(OutputBudgetOverflow) as info:
        await openai.complete(ModelRequest([Message.user("go")]))
    assert info.value.reduce_output_to == 96 and len(endpoint.requests) == 1

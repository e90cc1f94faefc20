"""`cmdc.providers.overflow.classify`: every way a provider says "too long", and what is not."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from cmdc.errors import (
    AuthError,
    BadRequest,
    CmdcError,
    ContextOverflow,
    HTTPProviderError,
    OutputBudgetOverflow,
    Overloaded,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    ServerError,
)
from cmdc.providers.overflow import classify, parse_retry_after


def openai_error(message: str, code: str | None = None, type_: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": "messages", "code": code}})


def anthropic_error(message: str, type_: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": type_, "message": message}})


# (label, status, headers, body, prompt_tokens, limit)
OVERFLOWS: list[tuple[str, int, dict[str, str], Any, int | None, int | None]] = [
    (
        "openai context_length_exceeded",
        400,
        {},
        openai_error(
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. "
            "Please reduce the length of the messages.",
            code="context_length_exceeded",
        ),
        9000,
        8192,
    ),
    (
        "openai configured limit",
        400,
        {},
        openai_error(
            "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 300000 tokens. "
            "Please reduce the length of the messages.",
            code="context_length_exceeded",
        ),
        300000,
        272000,
    ),
    (
        "openai responses: exceeds the context window",
        400,
        {},
        openai_error(
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            code="context_length_exceeded",
        ),
        None,
        None,
    ),
    (
        "exceeds the context window, no code",
        400,
        {},
        openai_error("Your input exceeds the context window of this model."),
        None,
        None,
    ),
    (
        "openai, messages and completion (older)",
        400,
        {},
        openai_error(
            "This model's maximum context length is 4097 tokens, however you requested 5000 tokens "
            "(4500 in your prompt; 500 for the completion). Please reduce your prompt; or completion length."
        ),
        4500,
        4097,
    ),
    (
        "deepseek: messages already over",
        400,
        {},
        openai_error(
            "This model's maximum context length is 65536 tokens. However, you requested 70000 tokens "
            "(70000 in the messages, 0 in the completion). Please reduce the length of the messages or completion."
        ),
        70000,
        65536,
    ),
    (
        "anthropic prompt is too long",
        400,
        {"request-id": "req_1"},
        anthropic_error("prompt is too long: 210000 tokens > 200000 maximum"),
        210000,
        200000,
    ),
    (
        "anthropic via an openai-compatible proxy",
        400,
        {},
        openai_error("prompt is too long: 210000 tokens > 200000 maximum"),
        210000,
        200000,
    ),
    (
        "gemini",
        400,
        {},
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1200000) exceeds the maximum number of tokens allowed "
                    "(1048576).",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ),
        1200000,
        1048576,
    ),
    (
        "gemini, as a list",
        400,
        {},
        orjson.dumps(
            [
                {
                    "error": {
                        "code": 400,
                        "message": "The input token count (1200000) exceeds the maximum number of tokens allowed "
                        "(1048576).",
                        "status": "INVALID_ARGUMENT",
                    }
                }
            ]
        ),
        1200000,
        1048576,
    ),
    (
        "vllm, older bare error object",
        400,
        {},
        orjson.dumps(
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                "(4500 in the messages, 500 in the completion). Please reduce the length of the messages or "
                "completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
        4500,
        4096,
    ),
    (
        "vllm, longer than the maximum model length",
        400,
        {},
        orjson.dumps(
            {
                "error": {
                    "message": "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
                    "Make sure that `max_model_len` is no smaller than the number of text tokens.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ),
        5000,
        4096,
    ),
    (
        "vllm, prompt length of",
        400,
        {},
        openai_error("Prompt length of 5000 is longer than the maximum model length of 4096.", type_="BadRequestError"),
        5000,
        4096,
    ),
    (
        "vllm, request has input tokens",
        400,
        {},
        openai_error(
            "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. "
            "Please reduce the length of the input messages.",
            type_="BadRequestError",
        ),
        5000,
        4096,
    ),
    (
        "llama.cpp",
        400,
        {},
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 5000,
                    "n_ctx": 4096,
                }
            }
        ),
        5000,
        4096,
    ),
    (
        "llama.cpp, text only",
        400,
        {},
        openai_error("the request exceeds the available context size, try increasing it", type_="server_error"),
        None,
        None,
    ),
    (
        "openrouter, error inside a 200 body",
        200,
        {},
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "This endpoint's maximum context length is 200000 tokens. However, you requested about "
                    "236255 tokens (228064 of text input, 8191 in the output). Please reduce the length of either "
                    'one, or use the "middle-out" transform to compress your prompt automatically.',
                }
            }
        ),
        228064,
        200000,
    ),
    (
        "openrouter, tool input counted in the prompt",
        400,
        {},
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "This endpoint's maximum context length is 131072 tokens. However, you requested about "
                    "140000 tokens (130000 of text input, 6000 of tool input, 4000 in the output).",
                }
            }
        ),
        136000,
        131072,
    ),
    (
        "openrouter, upstream error in metadata.raw",
        400,
        {},
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "Provider returned error",
                    "metadata": {
                        "raw": '{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too '
                        'long: 210000 tokens > 200000 maximum"}}',
                        "provider_name": "Anthropic",
                    },
                }
            }
        ),
        210000,
        200000,
    ),
    (
        "bedrock, input is too long",
        400,
        {"x-amzn-ErrorType": "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
        orjson.dumps({"message": "Input is too long for requested model."}),
        None,
        None,
    ),
    (
        "bedrock, anthropic model",
        400,
        {"x-amzn-errortype": "ValidationException"},
        orjson.dumps({"message": "prompt is too long: 210000 tokens > 200000 maximum"}),
        210000,
        200000,
    ),
    (
        "mistral",
        400,
        {},
        orjson.dumps(
            {
                "object": "error",
                "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum "
                "context length",
                "type": "invalid_request_message_error",
                "param": None,
                "code": None,
            }
        ),
        40000,
        32768,
    ),
    (
        "tgi",
        422,
        {},
        orjson.dumps(
            {
                "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
                "Given: 4500 `inputs` tokens and 500 `max_new_tokens`",
                "error_type": "validation",
            }
        ),
        4500,
        4096,
    ),
    (
        "xai",
        400,
        {},
        openai_error("This model's maximum prompt length is 131072 but the request contains 200000 tokens."),
        200000,
        131072,
    ),
    (
        "cohere",
        400,
        {},
        orjson.dumps(
            {"message": "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 5000"}
        ),
        5000,
        4081,
    ),
    (
        "plain-text body",
        400,
        {"content-type": "text/plain"},
        b"context length exceeded",
        None,
        None,
    ),
    (
        "numbers with separators",
        400,
        {},
        anthropic_error("prompt is too long: 210,000 tokens > 200,000 maximum"),
        210000,
        200000,
    ),
    (
        "a parsed error event",
        200,
        {},
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "prompt is too long: 12 tokens > 10 maximum"},
        },
        12,
        10,
    ),
]


@pytest.mark.parametrize(
    ("status", "headers", "body", "prompt", "limit"),
    [row[1:] for row in OVERFLOWS],
    ids=[row[0] for row in OVERFLOWS],
)
def test_overflow_shapes(
    status: int, headers: dict[str, str], body: Any, prompt: int | None, limit: int | None
) -> None:
    error = classify(status, headers, body)
    assert isinstance(error, ContextOverflow), error
    assert not isinstance(error, OutputBudgetOverflow)
    assert (error.prompt_tokens, error.limit) == (prompt, limit)
    # the same body as text and as bytes give the same answer
    if isinstance(body, bytes):
        again = classify(status, headers, body.decode())
        assert (type(again), again.prompt_tokens, again.limit) == (type(error), prompt, limit)  # type: ignore[attr-defined]


# (label, status, body, prompt_tokens, limit, reduce_output_to)
BUDGETS: list[tuple[str, int, Any, int, int, int]] = [
    (
        "anthropic input length and max_tokens",
        400,
        anthropic_error(
            "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000, decrease input length or "
            "`max_tokens` and try again"
        ),
        190000,
        200000,
        10000,
    ),
    (
        "vllm, messages and completion",
        400,
        openai_error(
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the "
            "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            type_="BadRequestError",
        ),
        4000,
        4096,
        96,
    ),
    (
        "vllm, max_tokens too large",
        400,
        openai_error(
            "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is 4096 "
            "tokens and your request has 3500 input tokens (1000 > 4096 - 3500).",
            type_="BadRequestError",
        ),
        3500,
        4096,
        596,
    ),
    (
        "tgi, inputs + max_new_tokens",
        422,
        orjson.dumps(
            {
                "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
                "Given: 3000 `inputs` tokens and 2000 `max_new_tokens`",
                "error_type": "validation",
            }
        ),
        3000,
        4096,
        1096,
    ),
]


@pytest.mark.parametrize(
    ("status", "body", "prompt", "limit", "reduce_to"), [row[1:] for row in BUDGETS], ids=[row[0] for row in BUDGETS]
)
def test_output_budget_overflows(status: int, body: Any, prompt: int, limit: int, reduce_to: int) -> None:
    error = classify(status, {}, body)
    assert isinstance(error, OutputBudgetOverflow), error
    assert isinstance(error, ContextOverflow)  # the agent's remedy (compaction) still applies
    assert (error.prompt_tokens, error.limit, error.reduce_output_to) == (prompt, limit, reduce_to)


def test_budget_overflow_with_the_input_alone_over_is_a_plain_overflow() -> None:
    error = classify(
        400, {}, anthropic_error("input length and `max_tokens` exceed context limit: 210000 + 4096 > 200000")
    )
    assert type(error) is ContextOverflow
    assert (error.prompt_tokens, error.limit) == (210000, 200000)


# (label, status, headers, body, expected class)
NOT_OVERFLOWS: list[tuple[str, int, dict[str, str], Any, type[ProviderError]]] = [
    (
        "string too long",
        400,
        {},
        openai_error(
            "Invalid 'messages[0].content': string too long. Expected a string with maximum length 1048576, but got "
            "a string with length 2000000 instead.",
            code="string_above_max_length",
        ),
        BadRequest,
    ),
    (
        "invalid 'user': string too long",
        400,
        {},
        openai_error(
            "Invalid 'user': string too long. Expected a string with maximum length 256, but got a string with "
            "length 300 instead.",
            code="string_above_max_length",
        ),
        BadRequest,
    ),
    (
        "string_above_max_length whatever the text",
        400,
        {},
        openai_error("the input exceeds the context window (not really)", code="string_above_max_length"),
        BadRequest,
    ),
    (
        "invalid tool schema",
        400,
        {},
        openai_error(
            "Invalid schema for function 'search': In context=('properties', 'q'), 'additionalProperties' is "
            "required to be supplied and to be false.",
            code="invalid_function_parameters",
        ),
        BadRequest,
    ),
    (
        "anthropic invalid tool schema",
        400,
        {},
        anthropic_error("tools.0.custom.input_schema: JSON schema is invalid - please consult https://json-schema.org"),
        BadRequest,
    ),
    (
        "openai max_tokens too large",
        400,
        {},
        openai_error(
            "max_tokens is too large: 200000. This model supports at most 16384 completion tokens, whereas you "
            "provided 200000.",
            code="invalid_value",
        ),
        BadRequest,
    ),
    (
        "anthropic max_tokens above the model's maximum",
        400,
        {},
        anthropic_error(
            "max_tokens: 300000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4"
        ),
        BadRequest,
    ),
    (
        "anthropic request too large (bytes)",
        413,
        {},
        anthropic_error("Request exceeds the maximum allowed number of bytes.", type_="request_too_large"),
        BadRequest,
    ),
    (
        "gemini payload size",
        400,
        {},
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "Request payload size exceeds the limit: 20971520 bytes.",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ),
        BadRequest,
    ),
    ("unknown model", 404, {}, openai_error("The model `gpt-9` does not exist", code="model_not_found"), BadRequest),
    ("openai 401", 401, {}, openai_error("Incorrect API key provided: sk-xx.", code="invalid_api_key"), AuthError),
    ("anthropic 401", 401, {}, anthropic_error("invalid x-api-key", type_="authentication_error"), AuthError),
    ("anthropic 403", 403, {}, anthropic_error("not allowed", type_="permission_error"), AuthError),
    (
        "openai insufficient_quota (a 429, not retried)",
        429,
        {},
        openai_error(
            "You exceeded your current quota, please check your plan and billing details.",
            code="insufficient_quota",
            type_="insufficient_quota",
        ),
        QuotaExceeded,
    ),
    ("payment required", 402, {}, b'{"error": {"message": "Insufficient credits"}}', QuotaExceeded),
    (
        "openai rate limit",
        429,
        {"retry-after": "7"},
        openai_error("Rate limit reached for requests", code="rate_limit_exceeded", type_="requests"),
        RateLimited,
    ),
    (
        "a rate limit mentioning the context is still a rate limit",
        429,
        {},
        openai_error("Request too large: maximum context length is 8192 tokens per minute", type_="tokens"),
        RateLimited,
    ),
    ("anthropic rate limit", 429, {}, anthropic_error("Number of requests", type_="rate_limit_error"), RateLimited),
    (
        "gemini resource exhausted",
        429,
        {},
        orjson.dumps(
            {"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}}
        ),
        RateLimited,
    ),
    ("anthropic 529", 529, {}, anthropic_error("Overloaded", type_="overloaded_error"), Overloaded),
    ("503", 503, {}, b"Service Unavailable", Overloaded),
    (
        "anthropic overloaded event inside a stream",
        200,
        {},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        Overloaded,
    ),
    ("anthropic api_error", 500, {}, anthropic_error("Internal server error", type_="api_error"), ServerError),
    ("502 html", 502, {}, b"<html><body>Bad gateway</body></html>", ServerError),
    ("408", 408, {}, b"", ServerError),
    ("409", 409, {}, b"", ServerError),
    (
        "openrouter 502 inside a 200 stream",
        200,
        {},
        {"error": {"code": 502, "message": "Provider returned error"}},
        ServerError,
    ),
    (
        "bedrock throttling",
        400,
        {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/"},
        orjson.dumps({"message": "Too many requests, please wait before trying again."}),
        RateLimited,
    ),
    (
        "422 validation",
        422,
        {},
        orjson.dumps({"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}),
        BadRequest,
    ),
]


@pytest.mark.parametrize(
    ("status", "headers", "body", "expected"),
    [row[1:] for row in NOT_OVERFLOWS],
    ids=[row[0] for row in NOT_OVERFLOWS],
)
def test_not_overflows(status: int, headers: dict[str, str], body: Any, expected: type[ProviderError]) -> None:
    error = classify(status, headers, body)
    assert not isinstance(error, ContextOverflow), error
    assert type(error) is expected, error
    assert isinstance(error, HTTPProviderError) and isinstance(error, CmdcError)
    if status != 200:
        assert error.status == status
    assert error.body is None or isinstance(error.body, str)


def test_errors_carry_status_body_and_retry_after() -> None:
    body = openai_error("Rate limit reached", code="rate_limit_exceeded")
    error = classify(429, {"Retry-After": "7"}, body)
    assert isinstance(error, RateLimited)
    assert error.status == 429 and error.body == body.decode() and error.retry_after == 7.0
    assert "Rate limit reached" in str(error)
    assert error.retryable
    # an error named inside a 200 body reports the status it names
    inner = classify(200, {}, {"error": {"code": 429, "message": "slow down"}})
    assert isinstance(inner, RateLimited) and inner.status == 429
    for err in (classify(401, {}, b""), classify(400, {}, b"{}"), classify(402, {}, b"")):
        assert not err.retryable  # type: ignore[attr-defined]


def test_errors_pickle() -> None:
    error = classify(429, {"retry-after-ms": "1500"}, openai_error("slow down", code="rate_limit_exceeded"))
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is RateLimited
    assert (str(again), again.status, again.body, again.retry_after) == (
        str(error),
        error.status,  # type: ignore[attr-defined]
        error.body,  # type: ignore[attr-defined]
        1.5,
    )
    budget = classify(400, {}, anthropic_error("input length and `max_tokens` exceed context limit: 1 + 5 > 3"))
    copy = pickle.loads(pickle.dumps(budget))
    assert type(copy) is OutputBudgetOverflow and copy.reduce_output_to == 2 and copy.prompt_tokens == 1


def test_retry_after_forms() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"Retry-After-Ms": "250", "retry-after": "9"}) == 0.25  # -ms wins
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after": "Wed, 01 Jan 2025 12:00:30 GMT"}, now=now) == 30.0
    assert parse_retry_after({"retry-after": "Wed, 01 Jan 2025 11:00:00 GMT"}, now=now) == 0.0  # past: no wait
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "nan"}) is None
    assert parse_retry_after({}) is None

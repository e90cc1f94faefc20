"""Model providers.

The HTTP providers (`OpenAIProvider`, `AnthropicProvider`) need the `http` extra
(`pip install 'cmdc-agents[http]'`: httpx); they are imported on first use, so
`import cmdc.providers` works without it. Their shared settings (`HTTPSettings`,
`ReplyLimits`) are plain values and need no extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._version import install_hint
from ._settings import HTTPSettings, ReplyLimits
from .base import ModelRequest, Provider, ToolSchema
from .extractive import ExtractiveSummarizer
from .scripted import ScriptedProvider
from .simulated import SimulatedModel

if TYPE_CHECKING:
    from .anthropic import AnthropicProvider
    from .openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "ExtractiveSummarizer",
    "HTTPSettings",
    "ModelRequest",
    "OpenAIProvider",
    "Provider",
    "ReplyLimits",
    "ScriptedProvider",
    "SimulatedModel",
    "ToolSchema",
]

_HTTP = {"OpenAIProvider": "openai", "AnthropicProvider": "anthropic"}


def __getattr__(name: str) -> Any:
    if name in _HTTP:
        import importlib

        try:
            module = importlib.import_module(f".{_HTTP[name]}", __name__)
        except ImportError as exc:
            raise ImportError(f"cmdc.providers.{name} needs the 'http' extra: {install_hint('http')} ({exc})") from exc
        value = getattr(module, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

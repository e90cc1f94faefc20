"""Model providers."""

from .base import ModelRequest, Provider, ToolSchema

__all__ = ["ModelRequest", "Provider", "ToolSchema"]

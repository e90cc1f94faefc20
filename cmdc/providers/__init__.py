"""Model providers."""

from .base import ModelRequest, Provider, ToolSchema
from .scripted import ScriptedProvider
from .simulated import SimulatedModel

__all__ = ["ModelRequest", "Provider", "ScriptedProvider", "SimulatedModel", "ToolSchema"]

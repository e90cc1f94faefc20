"""The actor layer: agents (one trio task each, serving a mailbox and running turns), their
handles, and the runtime that spawns, finds, supervises, deactivates and activates them."""

from .agent import Agent, AgentOptions, AgentRef, RestartPolicy
from .bus import EventBus, Subscription
from .runtime import Runtime, open_runtime

__all__ = ["Agent", "AgentOptions", "AgentRef", "EventBus", "RestartPolicy", "Runtime", "Subscription", "open_runtime"]

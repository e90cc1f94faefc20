"""The actor layer: agents (one trio task each, serving a mailbox and running turns), their
handles, and the runtime that spawns, finds, supervises, deactivates and activates them.

Modules: `options` (AgentOptions, SpawnOptions), `mailbox` (the requests and their reply slots),
`ref` (AgentRef, AgentHandle), `agent` (the task and its turn loop), `runtime` (Runtime,
open_runtime), `virtual` (activation and deactivation), `delegation` (grants, the delegate tool,
the wait-for graph), `leases` (name leases), `bus` (event subscriptions)."""

from .agent import Agent
from .bus import EventBus, Subscription
from .delegation import Grant
from .leases import DEFAULT_LEASE_TTL
from .options import AgentOptions, RestartPolicy, SpawnOptions
from .ref import AgentHandle, AgentRef
from .runtime import DEFAULT_RECALL_BUDGET, Runtime, open_runtime, with_instructions

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_RECALL_BUDGET",
    "Agent",
    "AgentHandle",
    "AgentOptions",
    "AgentRef",
    "EventBus",
    "Grant",
    "RestartPolicy",
    "Runtime",
    "SpawnOptions",
    "Subscription",
    "open_runtime",
    "with_instructions",
]

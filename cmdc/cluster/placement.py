"""Where an agent of the cluster lives: rendezvous hashing of its name over the live nodes
(`place`), and what it takes to start it on any node (`Spec`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import attrs

from ..compaction.summary import Summarizer
from ..errors import NodeLost
from ..plugins import Plugin
from ..providers.base import Provider
from ..runtime.options import AgentOptions
from ..tools import Tool


@attrs.frozen
class Spec:
    """What it takes to start an agent on any node."""

    provider: Provider
    instructions: str | None
    tools: tuple[Tool, ...]
    plugins: tuple[Plugin, ...]
    config: Mapping[str, Any] | None
    summarizer: Summarizer | None
    options: AgentOptions
    recall: bool
    targets: tuple[str, ...] | None  # agents it may delegate to besides its children (None: no delegate)
    accepts: tuple[str, ...] | None  # whose delegated tasks it takes (None: nobody's)
    gen: int = 0  # the newest node (by join number) when it was spawned: see place


def place(name: str, nodes: Mapping[str, int], gen: int) -> str:
    """The node of an agent: rendezvous hashing of its name over the live nodes (key -> join
    number) that had joined when it was spawned (join number <= `gen`), or over all live nodes
    if none of those is left. So a node's death moves only its own agents, and a node that joins
    later takes a share of the agents spawned after it joined and moves none of the others (an
    agent moving between two live nodes would wait out its lease and strand its queue)."""
    if not nodes:
        raise NodeLost("no cluster node is alive")
    eligible = [k for k, seq in nodes.items() if seq <= gen] or list(nodes)
    return max(eligible, key=lambda n: hashlib.blake2b(f"{n}\x00{name}".encode(), digest_size=8).digest())


__all__ = ["Spec", "place"]

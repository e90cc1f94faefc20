"""cmdc.ray on a local 3-node Ray cluster (`ray.cluster_utils.Cluster`, 1 CPU per node) with
the PostgreSQL store.

Run: eval "$(scripts/pg_test.sh start)"; python -m benchmarks.bench_ray [--quick] [--store URL]

- call overhead: a turn with an instant model, and a `ping`, on a cluster agent vs an agent of
  an in-process runtime on the same store (p50/p99, sequential calls);
- turns per second with 1, 2 and 3 nodes, many agents at once, on a `SimulatedModel` that waits
  200 ms per call as a real model does (the cluster's gain is concurrency: a node's CPU);
- a node killed: from `remove_node` to every affected agent answering again (on other nodes,
  from its last commit), and to the first of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio

import cmdc
import cmdc.ray
from cmdc.errors import NodeLost
from cmdc.providers import ScriptedProvider, SimulatedModel

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(n: int, call: Any) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t) * 1000)
    return out


async def overhead(url: str, n: int) -> None:
    async with cmdc.open_runtime(store=url, log_events=False) as rt:
        local = await rt.spawn("bench-local", ScriptedProvider(["ok"], cycle=True))
        await local.prompt("warm up")
        local_turn = await timed(n, lambda: local.prompt("hi"))
        local_ping = await timed(n, local.ping)
    async with cmdc.ray.open_cluster(store=url) as crt:
        remote = await crt.spawn("bench-remote", ScriptedProvider(["ok"], cycle=True))
        await remote.prompt("warm up")
        remote_turn = await timed(n, lambda: remote.prompt("hi"))
        remote_ping = await timed(n, remote.ping)
    print(f"call overhead ({n} sequential calls each, ms)        p50      p99")
    for label, values in (
        ("in-process turn (instant model, PG commit)", local_turn),
        ("cluster turn    (instant model, PG commit)", remote_turn),
        ("in-process ping", local_ping),
        ("cluster ping", remote_ping),
    ):
        print(f"  {label:<46} {pct(values, 0.5):8.2f} {pct(values, 0.99):8.2f}")


async def throughput(url: str, nodes: int, agents: int, turns: int, tag: str) -> float:
    async with cmdc.ray.open_cluster(store=url, nodes=nodes) as rt:
        refs = []
        limiter = trio.CapacityLimiter(64)

        async def spawn(i: int) -> None:
            async with limiter:
                refs.append(
                    await rt.spawn(f"{tag}-{i}", SimulatedModel(tool_probability=0, reply_chars=40, latency=0.2))
                )

        async with trio.open_nursery() as nursery:
            for i in range(agents):
                nursery.start_soon(spawn, i)

        async def talk(ref: Any) -> None:
            for t in range(turns):
                await ref.prompt(f"turn {t}")

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for ref in refs:
                nursery.start_soon(talk, ref)
        return agents * turns / (time.perf_counter() - start)


async def node_kill(url: str, cluster: Any, agents: int) -> None:
    import ray

    async with cmdc.ray.open_cluster(store=url, lease_ttl=30) as rt:
        head = ray.get_runtime_context().get_node_id()[:12]
        key = next(k for k in rt.nodes if k != head)
        victim = next(n for n in cluster.worker_nodes if n.node_id[:12] == key)
        refs = [await rt.spawn(f"kill-{i}", ScriptedProvider(["ok"], cycle=True)) for i in range(agents)]
        async with trio.open_nursery() as nursery:
            for ref in refs:
                nursery.start_soon(ref.prompt, "before")
        doomed = [r for r in refs if rt.node_of(r.name) == key]
        start = time.perf_counter()
        await trio.to_thread.run_sync(cluster.remove_node, victim, False)
        killed = time.perf_counter() - start
        answered: list[float] = []

        async def again(ref: Any) -> None:
            while True:
                try:
                    await ref.prompt("after")
                except NodeLost:
                    continue
                answered.append(time.perf_counter() - start)
                return

        async with trio.open_nursery() as nursery:
            for ref in doomed:
                nursery.start_soon(again, ref)
        print(
            f"node kill: {len(doomed)} of {agents} agents on the killed node; remove_node took {killed:.2f} s; "
            f"answering again after {min(answered):.2f} s (first) / {max(answered):.2f} s (all), "
            "counted from the kill"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default=os.environ.get("CMDC_TEST_POSTGRES_URL", ""))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not args.store.startswith("postgresql://"):
        sys.exit("bench_ray needs a PostgreSQL store: --store postgresql://... (or scripts/pg_test.sh start)")
    import ray
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    started = time.perf_counter()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
        },
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        took = time.perf_counter() - started
        print(f"a 3-node local Ray cluster started in {took:.1f} s; load average {os.getloadavg()[0]:.1f}")
        n = 50 if args.quick else 300
        trio.run(overhead, args.store, n)
        agents, turns = (60, 3) if args.quick else (300, 5)
        print(f"turns per second, {agents} agents x {turns} turns at once, SimulatedModel waiting 200 ms per call:")
        for nodes in (1, 2, 3):
            rate = trio.run(throughput, args.store, nodes, agents, turns, f"t{nodes}-{time.time_ns()}")
            print(f"  {nodes} node(s): {rate:7.1f} turns/s   (load average {os.getloadavg()[0]:.1f})")
        trio.run(node_kill, args.store, cluster, 30 if args.quick else 90)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()

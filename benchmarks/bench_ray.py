"""cmdc.ray on a local 3-node Ray cluster (`ray.cluster_utils.Cluster`, 1 CPU per node) with
the PostgreSQL store (a fresh database on the server `CMDC_TEST_POSTGRES_URL` names).

Run: eval "$(scripts/pg_test.sh start)"; python -m benchmarks.bench_ray [--quick] [--store URL]
(`python -m benchmarks` runs it too, in a subprocess, and puts its figures in its table.)

- call overhead: a turn with an instant model, and a `ping`, on a cluster agent vs an agent of
  an in-process runtime on the same store (p50/p99, sequential calls);
- turns per second with 1, 2 and 3 nodes, many agents at once, on a `SimulatedModel` that waits
  200 ms per call as a real model does, side by side, with the CPU each turn cost in the calling
  process, in the node processes and in PostgreSQL (what bounds the rate on a small machine);
- a node killed: from `remove_node` to every affected agent answering again (on other nodes,
  from its last commit), and to the first of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

import cmdc
from benchmarks.bench_store import fresh_database, postgres_base
from cmdc.errors import NodeLost
from cmdc.providers import ScriptedProvider, SimulatedModel

ROOT = Path(__file__).resolve().parent.parent
LATENCY = 0.2  # seconds the simulated model waits per call
_TICK = os.sysconf("SC_CLK_TCK")


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


# -- CPU accounting (Linux /proc) -------------------------------------------------------------
def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _postgres_pids() -> list[int]:
    """The PostgreSQL server's processes (the postmaster and its children), if its data
    directory is known (`CMDC_TEST_POSTGRES_DATA`, as scripts/pg_test.sh exports it)."""
    data = os.environ.get("CMDC_TEST_POSTGRES_DATA")
    if not data:
        return []
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            master = int(f.readline())
    except (OSError, ValueError):
        return []
    pids = [master]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == master:
                        pids.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


def _schedstat(pid: int, tid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of one thread so far."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _snapshot(rt: Any) -> dict[str, float]:
    stats = await rt.stats()
    busy, total = _machine_busy()
    threads = [_schedstat(s["pid"], s["trio_tid"]) for s in stats.values()]
    return {
        "trio_cpu": sum(t[0] for t in threads),
        "trio_wait": sum(t[1] for t in threads),
        "driver": _self_cpu(),
        "nodes": sum(s["cpu_ms"] for s in stats.values()) / 1000,
        "postgres": sum(_proc_cpu(p) for p in _postgres_pids()),
        "busy": busy,
        "total": total,
    }


# -- the figures -------------------------------------------------------------------------------
async def overhead(url: str, n: int) -> dict[str, list[float]]:
    async with cmdc.open_runtime(store=url, log_events=False) as rt:
        local = await rt.spawn("bench-local", ScriptedProvider(["ok"], cycle=True))
        await local.prompt("warm up")
        local_turn = await timed(n, lambda: local.prompt("hi"))
        local_ping = await timed(n, local.ping)
    from cmdc.ray import open_cluster

    async with open_cluster(store=url) as crt:
        remote = await crt.spawn("bench-remote", ScriptedProvider(["ok"], cycle=True))
        await remote.prompt("warm up")
        remote_turn = await timed(n, lambda: remote.prompt("hi"))
        remote_ping = await timed(n, remote.ping)
    return {
        "local_turn": local_turn,
        "cluster_turn": remote_turn,
        "local_ping": local_ping,
        "cluster_ping": remote_ping,
    }


async def throughput(url: str, nodes: int, agents: int, turns: int, tag: str) -> dict[str, float]:
    """`agents` agents each running `turns` turns one after another, all at once, on `nodes`
    nodes; the agents are spawned and have run one turn (they are active) before the clock starts."""
    from cmdc.ray import open_cluster

    async with open_cluster(store=url, nodes=nodes) as rt:
        refs: list[Any] = []
        limiter = trio.CapacityLimiter(64)

        async def spawn(i: int) -> None:
            async with limiter:
                ref = await rt.spawn(f"{tag}-{i}", SimulatedModel(tool_probability=0, reply_chars=40, latency=LATENCY))
                await ref.prompt("warm up")
                refs.append(ref)

        async with trio.open_nursery() as nursery:
            for i in range(agents):
                nursery.start_soon(spawn, i)

        async def talk(ref: Any) -> None:
            for t in range(turns):
                await ref.prompt(f"turn {t}")

        before = await _snapshot(rt)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for ref in refs:
                nursery.start_soon(talk, ref)
        wall = time.perf_counter() - start
        after = await _snapshot(rt)
        done = agents * turns
        cpu = {k: (after[k] - before[k]) for k in before}
        return {
            "rate": done / wall,
            "wall": wall,
            "ideal": agents / LATENCY,
            "driver_ms": cpu["driver"] / done * 1000,
            "nodes_ms": cpu["nodes"] / done * 1000,
            "postgres_ms": cpu["postgres"] / done * 1000,
            "machine_busy": cpu["busy"] / cpu["total"] if cpu["total"] else 0.0,
            # each node's trio thread: share of the wall clock on a CPU, and waiting for one
            "trio_on_cpu": cpu["trio_cpu"] / wall / nodes,
            "trio_waiting": cpu["trio_wait"] / wall / nodes,
            "cores": os.cpu_count() or 1,
        }


async def node_kill(url: str, cluster: Any, agents: int) -> dict[str, float]:
    import ray

    from cmdc.ray import open_cluster

    async with open_cluster(store=url, lease_ttl=30) as rt:
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
        return {
            "doomed": len(doomed),
            "agents": agents,
            "remove": killed,
            "first": min(answered),
            "all": max(answered),
        }


@contextlib.contextmanager
def local_cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    # the node processes import cmdc from this checkout when it is not installed
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
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
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def measure(url: str, *, quick: bool = False, out: Any = print) -> dict[str, Any]:
    """Every figure, printed as it comes (`out`) and returned."""
    figures: dict[str, Any] = {}
    started = time.perf_counter()
    with local_cluster() as cluster:
        out(f"a 3-node local Ray cluster started in {time.perf_counter() - started:.1f} s; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        n = 50 if quick else 300
        calls = trio.run(overhead, url, n)
        figures["overhead"] = {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for k, v in calls.items()}
        out(f"call overhead ({n} sequential calls each, ms)          p50      p99")
        for label, key in (
            ("in-process turn (instant model, PG commit)", "local_turn"),
            ("cluster turn    (instant model, PG commit)", "cluster_turn"),
            ("in-process ping", "local_ping"),
            ("cluster ping", "cluster_ping"),
        ):
            f = figures["overhead"][key]
            out(f"  {label:<48} {f['p50']:8.2f} {f['p99']:8.2f}")
        agents, turns = (120, 3) if quick else (400, 5)
        figures["agents"], figures["turns"] = agents, turns
        out(
            f"turns per second, {agents} agents x {turns} turns at once, SimulatedModel waiting "
            f"{LATENCY * 1000:.0f} ms per call (no CPU limit: {agents / LATENCY:,.0f}/s):"
        )
        out(
            "  nodes   turns/s   CPU ms per turn: caller  nodes  PostgreSQL   machine busy   "
            "a node's trio thread: on CPU / waiting for one   load"
        )
        for nodes in (1, 2, 3):
            r = trio.run(throughput, url, nodes, agents, turns, f"t{nodes}-{time.time_ns()}")
            figures[f"nodes_{nodes}"] = r
            out(
                f"  {nodes:>5} {r['rate']:9.1f}   {r['driver_ms']:22.2f} {r['nodes_ms']:6.2f} {r['postgres_ms']:11.2f}"
                f"   {r['machine_busy'] * 100:11.0f}%   {r['trio_on_cpu'] * 100:34.0f}%"
                f" / {r['trio_waiting'] * 100:3.0f}%   {os.getloadavg()[0]:4.1f}"
            )
        k = trio.run(node_kill, url, cluster, 30 if quick else 90)
        figures["kill"] = k
        out(
            f"node kill: {k['doomed']} of {k['agents']} agents on the killed node; remove_node took "
            f"{k['remove']:.2f} s; answering again after {k['first']:.2f} s (first) / {k['all']:.2f} s (all), "
            "counted from the kill"
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default=postgres_base() or "")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line at the end")
    args = parser.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        sys.exit("bench_ray: skipped, ray is not installed (pip install -e '.[ray,postgres]')")
    if not args.store.startswith("postgresql://"):
        sys.exit("bench_ray needs a PostgreSQL store: --store postgresql://... (or scripts/pg_test.sh start)")
    with fresh_database(args.store) as url:
        figures = measure(url, quick=args.quick, out=lambda s: print(s, file=sys.stderr if args.json else sys.stdout))
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""cmdc.ray on a real local Ray cluster (`ray.cluster_utils.Cluster`, 3 nodes of 1 CPU) with the
PostgreSQL store: spawn and talk across nodes, delegation across nodes, 1,000 agents x 10 turns,
and a node killed mid-turn. One cluster for the module (starting one takes seconds); each test
opens its own cluster runtime (node actors) over a fresh database, and is bounded in time.

Ray tests run when ray is installed and are skipped otherwise, unless `CMDC_REQUIRE_RAY=1` (as in
CI), which makes a missing ray a failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from cmdc import ConfigError, Message, NodeLost, open_runtime
from cmdc.errors import DelegationRefused
from cmdc.providers import ScriptedProvider, SimulatedModel

ROOT = Path(__file__).resolve().parents[2]

if os.environ.get("CMDC_REQUIRE_RAY", "") in ("", "0"):
    ray = pytest.importorskip("ray", reason="the Ray tests need ray: pip install -e '.[ray]'")
else:
    import ray
from ray.cluster_utils import Cluster  # noqa: E402

import cmdc.cluster.node  # noqa: E402
import cmdc.cluster.placement  # noqa: E402
import cmdc.ray  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not os.environ.get("CMDC_TEST_POSTGRES_URL") and os.environ.get("CMDC_REQUIRE_POSTGRES", "") in ("", "0"):
        pytest.skip("the Ray tests use the PostgreSQL store: see tests/conftest.py")  # before starting Ray
    # the node processes import cmdc from this checkout when it is not installed
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    made = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            # a dead node is noticed within about 2 s, not 30 s
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
        },
    )
    try:
        for _ in range(2):
            made.add_node(num_cpus=1)
        made.wait_for_nodes()
        ray.init(address=made.address, log_to_driver=False)
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


PAD = " " + " ".join(f"word{i}" for i in range(400))


def model(**kw: Any) -> SimulatedModel:
    return SimulatedModel(tool_probability=0, reply_chars=40, **kw)


async def test_spawn_and_talk_to_agents_across_three_nodes(cluster: Cluster, postgres_url: str) -> None:
    with trio.fail_after(120):
        async with cmdc.ray.open_cluster(store=postgres_url, lease_ttl=5) as rt:
            assert len(rt.nodes) == 3
            # at least 12 names, and as many more as it takes for every node to get one: hashing 12
            # names over 3 random node keys leaves a node empty about 2% of the time
            names: list[str] = []
            while len(names) < 12 or {rt.node_of(n) for n in names} != set(rt.nodes):
                names.append(f"agent-{len(names)}")
            refs = [await rt.spawn(n, model(), instructions="You are terse.") for n in names]
            assert {rt.node_of(n) for n in names} == set(rt.nodes)  # spread over every node
            assert rt.get("agent-3") is refs[3] and rt.whereis("nobody") is None
            for bad in ("../x", "", "a/b", ".hidden", "x" * 200):
                with pytest.raises(ConfigError):
                    await rt.spawn(bad, model())
            with pytest.raises(ConfigError, match="already running"):
                await rt.spawn("agent-3", model())
            with pytest.raises(ConfigError):
                await rt.spawn("fresh", model(), resume="maybe")  # type: ignore[arg-type]
            with pytest.raises(cmdc.AgentNotFound):
                await rt.spawn("fresh", model(), resume="require")
            with pytest.raises(cmdc.AgentNotFound):
                rt.get("fresh")
            async with rt.subscribe("agent-0") as sub:
                for ref in refs:
                    reply = await ref.prompt(f"hello {ref.name}")
                    assert reply.role == "assistant" and f"hello {ref.name}" in reply.text
                kinds = []
                with trio.move_on_after(10):
                    async for event in sub:
                        kinds.append(event.kind)
                        if event.kind == "turn_end":
                            break
                assert "turn_end" in kinds
            await refs[0].send("queued one")
            assert [m.text for m in await refs[0].queued()] == ["queued one"]
            again_msg = (await refs[0].queued())[0]
            for bad_send in (again_msg, [Message.user("x")] * 2, [], 5):  # the handle holds each id once
                with pytest.raises(ConfigError):
                    await refs[0].send(bad_send)  # type: ignore[arg-type]
            assert [m.text for m in await refs[0].queued()] == ["queued one"]
            await refs[0].prompt("and now")
            state = await refs[0].state()
            texts = [m.text for m in state.messages]
            assert texts[0] == "You are terse." and "queued one" in texts and "and now" in texts
            # what the nodes committed is in the store
            for ref in refs:
                saved = await rt.store.checkpoints.load(ref.name)
                assert saved is not None and saved == await ref.state()
            # a cancelled caller cancels the turn on its node; the state stays at the last commit
            slow = await rt.spawn("slow", model(latency=30.0))
            with trio.move_on_after(2):
                await slow.prompt("never answered")
            with trio.fail_after(20):  # the turn would hold the mailbox for 30 s: it was cancelled
                await slow.ping()
            assert (await slow.state()).messages == ()
            await refs[1].stop()
            assert rt.whereis("agent-1") is None and not refs[1].running
            with pytest.raises(cmdc.AgentStopped):
                await refs[1].prompt("still there?")
            # a stopped name can be spawned again, from its checkpoint with resume=True
            again = await rt.spawn("agent-1", model(), resume=True)
            assert len((await again.state()).messages) == len((await refs[2].state()).messages)
            stats = await rt.stats()
            assert sum(s["resident"] for s in stats.values()) == len(names) + 1  # every agent-N, and "slow"


@pytest.mark.parametrize(
    "options",
    [{"lease_ttl": 0}, {"lease_ttl": float("inf")}, {"nodes": 0}, {"max_concurrency": 0}, {"max_resident": -1},
     {"deactivate_after": True}, {"store": object()}, {"store": 5}, {"discover_every": 0},
     {"discover_every": float("nan")}, {"discover_every": "5"}],
)
async def test_hostile_options_are_refused_before_anything_starts(options: dict[str, Any], tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {"store": str(tmp_path / "store"), **options}
    with pytest.raises(ConfigError):
        async with cmdc.ray.open_cluster(**kwargs):
            pass
    assert not (tmp_path / "store").exists()


def pick_names(rt: Any, prefix: str) -> tuple[str, str]:
    """Two names placed on different nodes."""
    first = f"{prefix}-a"
    for i in range(100):
        other = f"{prefix}-{i}"
        if rt.node_of(other) != rt.node_of(first):
            return first, other
    raise AssertionError("no two names on different nodes")


async def test_delegation_across_nodes(cluster: Cluster, postgres_url: str) -> None:
    with trio.fail_after(120):
        async with cmdc.ray.open_cluster(store=postgres_url, lease_ttl=5) as rt:
            boss, worker = pick_names(rt, "d")
            call = ScriptedProvider.tool_call("delegate", {"task": "count to three", "agent": worker})
            boss_model = ScriptedProvider([call, lambda request: f"the worker said: {request.messages[-1].text}"])
            b = await rt.spawn(boss, boss_model, delegation=[worker])
            await rt.spawn(worker, ScriptedProvider(["one two three"], cycle=True), accepts=[boss])
            assert rt.node_of(boss) != rt.node_of(worker)
            reply = await b.prompt("get it counted")
            assert reply.text == "the worker said: one two three"
            worker_state = await rt.get(worker).state()
            assert [m.text for m in worker_state.messages] == ["count to three", "one two three"]
            # a worker that does not accept the sender refuses, and the boss sees why
            other, _ = pick_names(rt, "o")
            refused = ScriptedProvider.tool_call("delegate", {"task": "x", "agent": worker})
            o = await rt.spawn(other, ScriptedProvider([refused, lambda r: r.messages[-1].text]), delegation="*")
            answer = await o.prompt("try")
            assert "does not accept" in answer.text
            # delegation=True (as on one machine): temporary children, on the parent's node; a
            # child that fails, or one too many, is an error result the parent's model reads
            child_call = ScriptedProvider.tool_call("delegate", {"task": "say hi"})
            parent_model = ScriptedProvider(
                [child_call, "hi from the child", lambda r: f"child: {r.messages[-1].text}"], cycle=True
            )
            async with rt.subscribe() as sub:
                p = await rt.spawn("parent", parent_model, delegation=True)
                for _ in range(2):
                    assert (await p.prompt("delegate it")).text == "child: hi from the child"
                children: list[str] = []
                with trio.move_on_after(10):
                    async for event in sub:
                        who = event.agent_id or ""
                        if who.startswith("parent.child") and who not in children:
                            children.append(who)
                        if len(children) == 2:
                            break
            assert len(children) == 2 and all(re.fullmatch(r"parent\.child[12]-[0-9a-f]{12}", c) for c in children)
            assert rt.agents.count("parent") == 1 and not any(".child" in a for a in rt.agents)
            for child in children:  # a temporary child leaves no checkpoint behind
                assert await rt.store.checkpoints.load(child) is None
            # the parent may not name agents it was not granted; children count against the depth
            named = ScriptedProvider.tool_call("delegate", {"task": "x", "agent": worker})
            lone = await rt.spawn("lone", ScriptedProvider([named, lambda r: r.messages[-1].text]), delegation=True)
            assert "may not delegate" in (await lone.prompt("try")).text
            none_allowed = ScriptedProvider([child_call, lambda r: r.messages[-1].text])
            capped = await rt.spawn("capped", none_allowed, delegation=True, max_delegation_depth=1)
            assert "depth limit" in (await capped.prompt("try")).text
            # a target outside the grant is refused on the delegating side
            with pytest.raises(DelegationRefused):
                await cmdc.cluster.node.cluster_delegate(None, "x", ("w1*",), 4).run({"task": "t", "agent": "w2"})  # type: ignore[arg-type]


async def test_a_thousand_agents_ten_turns_each_nothing_lost(cluster: Cluster, postgres_url: str) -> None:
    agents, turns = 1_000, 10
    with trio.fail_after(240):
        async with cmdc.ray.open_cluster(store=postgres_url, lease_ttl=10) as rt:
            limiter = trio.CapacityLimiter(64)
            refs: list[Any] = []

            async def spawn(i: int) -> None:
                async with limiter:
                    refs.append(await rt.spawn(f"m{i}", ScriptedProvider(["ok"], cycle=True)))

            async with trio.open_nursery() as nursery:
                for i in range(agents):
                    nursery.start_soon(spawn, i)
            answered = 0

            async def talk(ref: Any) -> None:
                nonlocal answered
                for t in range(turns):
                    async with limiter:
                        reply = await ref.prompt(f"{ref.name} turn {t}")
                    assert reply.text == "ok"
                    answered += 1

            async with trio.open_nursery() as nursery:
                for ref in refs:
                    nursery.start_soon(talk, ref)
            assert answered == agents * turns
            stats = await rt.stats()
            assert len([k for k, s in stats.items() if s["activations"] + s["resident"] > 0]) == 3
        # every turn is committed in the store
        async with open_runtime(store=postgres_url, log_events=False) as check:
            assert check.checkpoints is not None
            for i in range(agents):
                state = await check.checkpoints.load(f"m{i}")
                assert state is not None
                assert [m.text for m in state.messages if m.role == "user"] == [f"m{i} turn {t}" for t in range(turns)]


async def test_a_node_killed_mid_turn(cluster: Cluster, postgres_url: str) -> None:
    with trio.fail_after(180):
        async with cmdc.ray.open_cluster(store=postgres_url, lease_ttl=30) as rt:
            head = ray.get_runtime_context().get_node_id()[:12]
            victim_key = next(k for k in rt.nodes if k != head)
            victim = next(n for n in cluster.worker_nodes if n.node_id[:12] == victim_key)
            names = [f"k{i}" for i in range(40)]
            # long prompts and a low trigger: the turns after the crash compact, on the new nodes
            config = {"compact_trigger": ("messages", 3), "compact_keep": ("messages", 1)}
            refs = {n: await rt.spawn(n, model(latency=3.0), config=config) for n in names}
            doomed = [n for n in names if rt.node_of(n) == victim_key]
            safe = [n for n in names if rt.node_of(n) != victim_key]
            assert doomed and safe
            # one committed turn each (acknowledged: must survive the crash)
            async with trio.open_nursery() as nursery:
                for ref in refs.values():
                    nursery.start_soon(ref.prompt, "first" + PAD)
            outcomes: dict[str, Any] = {}

            async def second(name: str) -> None:
                try:
                    outcomes[name] = await refs[name].prompt("second" + PAD)
                except NodeLost as exc:
                    outcomes[name] = exc

            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(second, name)
                await trio.sleep(1.0)  # the second turns are in flight on every node
                for name in names:  # acknowledged sends, queued behind the turns in flight
                    await refs[name].send("queued" + PAD)
                await trio.to_thread.run_sync(cluster.remove_node, victim, False)
            assert rt.node_deaths == 1 and victim_key not in rt.nodes
            for name in safe:
                assert isinstance(outcomes[name], Message), outcomes[name]
            lost = [n for n in doomed if isinstance(outcomes[n], NodeLost)]
            assert lost, outcomes  # the turns in flight on the dead node did not commit
            for name in doomed:
                # the next call activates the agent on a live node from its last commit
                state = await refs[name].state()
                users = [m.text.split()[0] for m in state.messages if m.role == "user"]
                assert users == (["first"] if name in lost else ["first", "second"])
                assert [m.text.split()[0] for m in await refs[name].queued()] == ["queued"]  # queued again
                assert await rt.store.read(name) == [] or name not in lost  # an uncommitted batch is invisible

            async def third(name: str) -> None:
                assert "third" in (await refs[name].prompt("third" + PAD)).text

            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(third, name)
            compacted = 0
            for name in names:
                # journal + live context: every message once, every user message that committed
                state = await refs[name].state()
                live = [m for m in state.messages if m.metadata.get("cmdc.kind") != "summary"]
                journal = [m for m in await rt.store.read(name) if m.metadata.get("cmdc.kind") != "summary"]
                everything = [*journal, *live]
                assert len({m.id for m in everything}) == len(everything)
                users = [m.text.split()[0] for m in everything if m.role == "user"]
                # the message queued with send before the crash is there once, on a moved agent too
                expected = ["first", "queued", "third"] if name in lost else ["first", "second", "queued", "third"]
                assert sorted(users) == sorted(expected), (name, users)  # (the first task may stay pinned)
                compacted += bool(state.compactions and journal)
                report = await rt.store.verify(name)
                assert report.clean
            assert compacted  # journals were written, across the crash, and read back exactly once
        cluster.add_node(num_cpus=1)  # back to three nodes for any later test
        cluster.wait_for_nodes()


def test_placement_takes_new_nodes_for_new_agents_only() -> None:
    place = cmdc.cluster.placement.place
    old = {"a": 0, "b": 1}
    grown = {**old, "c": 2}
    names = [f"n{i}" for i in range(60)]
    # an agent spawned before "c" joined stays where it was; those spawned after spread onto it
    assert all(place(n, grown, 1) == place(n, old, 1) for n in names)
    assert {place(n, grown, 2) for n in names} == {"a", "b", "c"}
    # a dead node's agents move to the nodes of their time; with none left, to any live node
    assert {place(n, {"b": 1, "c": 2}, 1) for n in names} == {"b"}
    assert {place(n, {"c": 2}, 1) for n in names} == {"c"}
    with pytest.raises(NodeLost):
        place("x", {}, 0)


async def test_a_node_added_later_takes_agents(cluster: Cluster, postgres_url: str) -> None:
    with trio.fail_after(300):  # starting a Ray node takes from 5 s (idle) to over a minute (loaded)
        async with cmdc.ray.open_cluster(store=postgres_url, lease_ttl=5, discover_every=0.5) as rt:
            before = set(rt.nodes)
            early = [await rt.spawn(f"early-{i}", model()) for i in range(12)]
            placed = {r.name: rt.node_of(r.name) for r in early}
            sub = rt.subscribe()  # opened before the node joins: it follows the new node too
            await sub.started()
            added = cluster.add_node(num_cpus=1)  # (blocks trio a few seconds: Ray wants the main thread)
            try:
                cluster.wait_for_nodes()
                while len(rt.nodes) == len(before):  # noqa: ASYNC110 (the runtime looks every 0.5 s)
                    await trio.sleep(0.2)
                assert await rt.add_nodes() == []  # nothing more to add
                (new,) = set(rt.nodes) - before
                # at least 24 names, with some placed on the new node and some not (by chance alone
                # none would be about 0.1% of the time)
                lates: list[str] = []
                while len(lates) < 24 or len({rt.node_of(n) == new for n in lates}) < 2:
                    lates.append(f"late-{len(lates)}")
                late = [await rt.spawn(n, model()) for n in lates]
                on_new = [r for r in late if rt.node_of(r.name) == new]
                assert on_new and len(on_new) < len(late)
                for ref in [*early, *late]:
                    assert f"hi {ref.name}" in (await ref.prompt(f"hi {ref.name}")).text
                assert {r.name: rt.node_of(r.name) for r in early} == placed  # nobody moved
                with trio.fail_after(20):
                    async for event in sub:
                        if event.agent_id == on_new[-1].name and event.kind == "turn_end":
                            break
                sub.close()
                stats = await rt.stats()
                assert stats[new]["resident"] == len(on_new)  # they run there
                # delegation from an old node reaches an agent on the new one
                boss = next(f"boss-{i}" for i in range(100) if rt.node_of(f"boss-{i}") != new)
                worker = next(f"worker-{i}" for i in range(100) if rt.node_of(f"worker-{i}") == new)
                await rt.spawn(worker, ScriptedProvider(["pong"], cycle=True), accepts=[boss])
                call = ScriptedProvider.tool_call("delegate", {"task": "ping", "agent": worker})
                b = await rt.spawn(boss, ScriptedProvider([call, lambda r: r.messages[-1].text]), delegation=[worker])
                assert (await b.prompt("ask the new node")).text == "pong"
            finally:
                await trio.to_thread.run_sync(lambda: cluster.remove_node(added))


QUIET_START = """
import sys, trio, cmdc, cmdc.ray
from cmdc.providers import ScriptedProvider

async def main():
    async with cmdc.ray.open_cluster(None, store=sys.argv[1], nodes=1, discover_every=None) as rt:
        ref = await rt.spawn("a1", ScriptedProvider(["hi"]))
        print((await ref.prompt("x")).text)

trio.run(main)
"""


def test_a_ray_started_by_open_cluster_prints_nothing(tmp_path: Path) -> None:
    """`open_cluster(None, ...)` starts a local Ray from a worker thread: Ray's notices (no SIGTERM
    handler off the main thread, token authentication, "Started a local Ray instance") are not
    printed. In a fresh process, without the module's cluster."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    # a Ray directory of its own (short: Ray's sockets live in it), so the module's cluster, when
    # it runs, is not found and joined instead of a new Ray being started
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    done = subprocess.run(
        [sys.executable, "-c", QUIET_START, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "hi\n", "")

"""The cutoff: pinned / evicted / kept, with tool pairs never split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc import Message, State, estimate_message_tokens, split_messages
from cmdc.compaction.config import Threshold
from cmdc.message import PINNED_KEY
from tests._support.cutoff_oracle import oracle_split
from tests._support.fakes import asst, check_pairs, conversations, res


def idx(messages: list[Message], part: tuple[Message, ...]) -> list[int]:
    return [messages.index(m) for m in part]


def test_interleaved_parallel_calls_cut_at_index_3() -> None:
    ms = [Message.user("u"), asst("X"), asst("Y"), res("X"), res("Y"), Message.user("u2")]
    # keep 3 puts the raw cut at index 3, between tool(X) and tool(Y)
    s = split_messages(ms, Threshold("messages", 3))
    assert idx(ms, s.evicted) == [0]
    assert idx(ms, s.kept) == [1, 2, 3, 4, 5]
    check_pairs(s.kept, ms)


def test_ten_parallel_calls_cut_inside_results() -> None:
    ids = [f"c{i}" for i in range(10)]
    ms = [Message.system("sys"), Message.user("go"), asst(*ids), *[res(i) for i in reversed(ids)], Message.user("next")]
    for keep in range(1, 12):
        s = split_messages(ms, Threshold("messages", keep))
        assert s.pinned == (ms[0],)
        check_pairs(s.kept, ms)
        evicted = idx(ms, s.evicted)
        assert evicted in ([1, *range(2, 13)], [1], []), (keep, evicted)


def test_pending_call_at_end_with_keep_one() -> None:
    ms = [Message.user("u"), asst("A"), res("A"), Message.user("u2"), asst("P")]
    s = split_messages(ms, Threshold("messages", 1))
    assert idx(ms, s.kept) == [4]
    assert idx(ms, s.evicted) == [0, 1, 2, 3]


def test_pending_call_in_the_middle_is_kept_with_partial_results() -> None:
    ms = [Message.user("u"), asst("A", "B"), res("A"), Message.user("u2"), Message.user("u3")]
    s = split_messages(ms, Threshold("messages", 1))
    assert idx(ms, s.kept) == [1, 2, 4]  # B never answered: the group stays whole
    check_pairs(s.kept, ms)


def test_pinned_messages_keep_their_group() -> None:
    pinned_result = Message.tool_result("A", "important", metadata={PINNED_KEY: True})
    ms = [Message.user("u"), asst("A"), pinned_result, Message.user("x"), Message.user("y")]
    s = split_messages(ms, Threshold("messages", 1))
    assert idx(ms, s.kept) == [1, 2, 4]
    s = split_messages(ms, Threshold("messages", 1), pinned_ids={ms[0].id})
    assert idx(ms, s.kept) == [0, 1, 2, 4] and idx(ms, s.evicted) == [3]


def test_keep_by_tokens_keeps_at_least_the_last_message() -> None:
    ms = [Message.user("a" * 400), Message.user("b" * 400), Message.user("c" * 4000)]
    s = split_messages(ms, Threshold("tokens", 10))
    assert idx(ms, s.kept) == [2]
    s = split_messages(ms, Threshold("tokens", 10_000))
    assert s.evicted == ()


def test_keep_by_fraction_uses_the_window() -> None:
    ms = [Message.user("x" * 384) for _ in range(10)]  # 96 + 4 = 100 tokens each
    s = split_messages(ms, Threshold("fraction", 0.3), context_window=1000)
    assert len(s.kept) == 3


def test_only_a_summary_is_not_worth_evicting() -> None:
    summary = Message.user("old summary", metadata={"cmdc.kind": "summary"})
    s = split_messages([summary, Message.user("u")], Threshold("messages", 1))
    assert s.evicted == (summary,) and not s.evicts_anything


keeps = st.one_of(
    st.builds(Threshold, st.just("messages"), st.integers(1, 30)),
    st.builds(Threshold, st.just("tokens"), st.integers(1, 2000)),
    st.builds(Threshold, st.just("fraction"), st.floats(0.01, 1.0)),
)


@settings(max_examples=400, deadline=None)
@given(conversations(), keeps)
def test_split_properties(ms: list[Message], keep: Threshold) -> None:
    s = split_messages(ms, keep, context_window=2000)
    order = {m.id: i for i, m in enumerate(ms)}
    # a partition of the original, each part in original order
    assert sorted(order[m.id] for m in (*s.pinned, *s.evicted, *s.kept)) == list(range(len(ms)))
    for part in (s.pinned, s.evicted, s.kept):
        assert [order[m.id] for m in part] == sorted(order[m.id] for m in part)
    assert all(m.role == "system" for m in s.pinned)
    check_pairs(s.kept, ms)
    evicted_calls = {c.id for m in s.evicted for c in m.tool_calls}
    evicted_results = {m.tool_call_id for m in s.evicted if m.role == "tool"}
    assert evicted_calls == evicted_results
    if not s.evicted:
        return
    # everything kept before the last evicted message is held back by a pin or a pending call
    last = max(order[m.id] for m in s.evicted)
    answered = {m.tool_call_id for m in ms if m.role == "tool"}
    for m in s.kept:
        if order[m.id] < last and not m.is_pinned:
            call_ids = {c.id for c in m.tool_calls} or {m.tool_call_id}
            owner = next(a for a in ms if {c.id for c in a.tool_calls} & call_ids)
            group = [owner, *(r for r in ms if r.tool_call_id in {c.id for c in owner.tool_calls})]
            assert any(c.id not in answered for c in owner.tool_calls) or any(g.is_pinned for g in group)


@settings(max_examples=400, deadline=None)
@given(conversations(orphans=True), keeps, st.data())
def test_split_matches_the_oracle_written_from_the_rules(
    ms: list[Message], keep: Threshold, data: st.DataObject
) -> None:
    ids = [m.id for m in ms]
    pinned_ids = data.draw(st.sets(st.sampled_from(ids))) if ids and data.draw(st.booleans()) else set()
    unpinned_ids = data.draw(st.sets(st.sampled_from(ids))) if ids and data.draw(st.booleans()) else set()
    # small counts make a suffix land exactly on the budget often (the boundary is `<=`)
    count = data.draw(st.sampled_from([estimate_message_tokens, lambda m: 1, lambda m: len(m.text) % 7]))
    if count is not estimate_message_tokens and keep.mode == "tokens":
        keep = Threshold("tokens", data.draw(st.integers(1, 40)))
    expected = oracle_split(
        ms, (keep.mode, keep.value), context_window=2000, count=count, pinned_ids=pinned_ids, unpinned_ids=unpinned_ids
    )
    state = State(agent_id="p")
    for m in ms:  # the index as append keeps it, message by message
        state = state.append(m)
    for index in (None, state.call_index):
        got = split_messages(
            ms, keep, context_window=2000, count=count, pinned_ids=pinned_ids, unpinned_ids=unpinned_ids, index=index
        )
        assert (got.pinned, got.evicted, got.kept) == expected
        held = {m.id for m in got.held}
        tail = [m for m in got.kept if m.id not in held]
        assert held <= {m.id for m in got.kept} and (not tail or ms[len(ms) - len(tail) :] == tail)


def test_the_oracle_on_the_rules_by_hand() -> None:
    # the oracle itself, on cases worked out from docs/design.md alone
    system, u1, call, r_a, u2, r_b, u3 = (
        Message.system("s"),
        Message.user("u1"),
        asst("A", "B"),
        res("A"),
        Message.user("u2"),
        res("B"),
        Message.user("u3"),
    )
    ms = [system, u1, call, r_a, u2, r_b, u3]
    # keep 3 cuts between r_a and u2: the call's group straddles it, so the cut moves to the call
    assert oracle_split(ms, ("messages", 3)) == ((system,), (u1,), (call, r_a, u2, r_b, u3))
    # keep 1: the group lies wholly before the cut, evicted with its results
    assert oracle_split(ms, ("messages", 1)) == ((system,), (u1, call, r_a, u2, r_b), (u3,))
    # a pin on one result holds the whole group back, from anywhere before the cut
    assert oracle_split(ms, ("messages", 1), pinned_ids={r_b.id}) == ((system,), (u1, u2), (call, r_a, r_b, u3))
    assert oracle_split(ms, ("messages", 1), pinned_ids={r_b.id}, unpinned_ids={r_b.id})[2] == (u3,)
    # a pending call is held back with the results it has
    pending = [u1, asst("C", "D"), res("C"), u2, u3]
    assert oracle_split(pending, ("messages", 1)) == ((), (u1, u2), (pending[1], pending[2], u3))
    # by tokens: the longest suffix within the budget, and always the last message
    big = [Message.user("x" * 400), Message.user("y" * 400), Message.user("z" * 4000)]
    assert oracle_split(big, ("tokens", 10))[2] == (big[2],)
    assert oracle_split(big, ("tokens", 10_000))[1] == ()
    # only system messages: nothing to cut
    assert oracle_split([system], ("messages", 1)) == ((system,), (), ())

"""The offline extractive summarizer: every section of the structured prompt, folding an earlier
summary, the character budget, determinism; stripping a model's analysis scratchpad."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc import Message, ToolCall
from cmdc.compaction.config import DEFAULT_SUMMARY_PROMPT
from cmdc.compaction.summary import ExtractiveSummarizer, render_transcript, strip_scratchpad, summary_message
from cmdc.providers import ModelRequest
from tests._support.fakes import SECTIONS as HEADINGS

TASK = "Build the invoice export: add GET /invoices/export to src/api/routes.py for ticket PAY-4821."
CONSTRAINTS = [
    "Constraint 1: keep parse_invoice() backwards compatible.",
    "Constraint 2: amounts stay in integer cents, see src/billing/money.py.",
    "Constraint 3: reference ticket OPS-1177 in the changelog.",
    "Constraint 4: the export goes through the InvoiceExporter class.",
    "Constraint 5: docs go to docs/billing/export.md.",
    "Constraint 6: the feature flag is INVOICE_EXPORT_ENABLED.",
    "Constraint 7: never call https://api.billing.example/v1 from tests.",
    'Constraint 8: use "streaming CSV" for large exports.',
    "Constraint 9: the timeout is 7 seconds.",
    "Constraint 10: do not add new dependencies.",
]
IDENTIFIERS = [
    "src/api/routes.py",
    "PAY-4821",
    "parse_invoice()",
    "src/billing/money.py",
    "OPS-1177",
    "InvoiceExporter",
    "docs/billing/export.md",
    "INVOICE_EXPORT_ENABLED",
    "https://api.billing.example/v1",
]


def call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def part_one() -> list[Message]:
    """The task, five constraints, a tool call that fails and the fix."""
    return [
        Message.user(TASK),
        Message.assistant("Reading the routes first.", tool_calls=[call("c1", "read_file", path="src/api/routes.py")]),
        Message.tool_result("c1", "from fastapi import APIRouter\nrouter = APIRouter()"),
        Message.assistant("The router is in place; I will add the export route next."),
        Message.user(CONSTRAINTS[0]),
        Message.assistant("Noted, parse_invoice() stays compatible."),
        Message.user(CONSTRAINTS[1]),
        Message.assistant("Running the tests.", tool_calls=[call("c2", "run_tests", target="tests/test_export.py")]),
        Message.tool_result(
            "c2",
            "Traceback (most recent call last):\n  File \"src/billing/invoice.py\", line 3\nKeyError: 'currency'",
            is_error=True,
        ),
        Message.assistant("Fixed the KeyError in parse_invoice() by defaulting the currency to EUR."),
        Message.user(CONSTRAINTS[2]),
        Message.assistant("OPS-1177 will be in the changelog."),
        Message.user(CONSTRAINTS[3]),
        Message.user(CONSTRAINTS[4]),
        Message.assistant("Understood: InvoiceExporter, and docs in docs/billing/export.md."),
    ]


def part_two() -> list[Message]:
    """Five more constraints, a passing run, and a tool call still waiting for its result."""
    return [
        Message.user(CONSTRAINTS[5]),
        Message.assistant("The flag INVOICE_EXPORT_ENABLED guards the route."),
        Message.user(CONSTRAINTS[6]),
        Message.user(CONSTRAINTS[7]),
        Message.assistant("Re-running the tests.", tool_calls=[call("c3", "run_tests", target="tests/test_export.py")]),
        Message.tool_result("c3", "12 passed in 0.4s"),
        Message.assistant("All 12 tests pass. The export streams rows with InvoiceExporter."),
        Message.user(CONSTRAINTS[8]),
        Message.user(CONSTRAINTS[9]),
        Message.assistant("Now running the linter on src/api/routes.py.", tool_calls=[call("c4", "lint", path="src")]),
    ]


def sections(text: str) -> dict[str, list[str]]:
    """`## ` heading -> its lines (items keep their `- `)."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("## "):
            current = out.setdefault(line[3:], [])
        elif line.strip():
            current.append(line)
    return out


def items(text: str, heading: str) -> list[str]:
    return [line[2:] for line in sections(text)[heading] if line.startswith("- ")]


def headings(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def previous_summary(text: str, evicted: int) -> Message:
    return summary_message(
        text, compaction=1, evicted=evicted, offload_path="/tmp/journal/agent.jsonl", first_seq=1, last_seq=evicted
    )


def test_headings_are_those_of_the_default_prompt() -> None:
    prompt_headings = [line[3:] for line in DEFAULT_SUMMARY_PROMPT.splitlines() if line.startswith("## ")]
    assert prompt_headings == HEADINGS
    assert headings(ExtractiveSummarizer().summarize([])) == HEADINGS


def test_a_session_gives_every_section_in_order() -> None:
    text = ExtractiveSummarizer().summarize(part_one() + part_two())
    assert headings(text) == HEADINGS
    assert len(text) <= 6_000

    assert items(text, "Primary request and intent") == [TASK]

    concepts = items(text, "Key concepts")
    assert "parse_invoice()" in concepts and "InvoiceExporter" in concepts  # recurring
    assert "streaming CSV" in concepts  # quoted
    assert concepts.index("parse_invoice()") < concepts.index("streaming CSV")  # by frequency

    files = items(text, "Files and code")
    keys = [f.split(" \u2014 ")[0] for f in files]
    for ident in IDENTIFIERS:
        assert ident in keys, ident
    positions = [keys.index(ident) for ident in IDENTIFIERS]
    assert positions == sorted(positions)  # first-seen order
    assert "src/api/routes.py \u2014 read_file, lint" not in files  # lint got "src", not the file
    assert "src/api/routes.py \u2014 read_file" in files
    assert "tests/test_export.py \u2014 run_tests" in files
    assert "src/billing/invoice.py" in keys  # from the traceback

    errors = items(text, "Errors and fixes")
    assert len(errors) == 1
    assert errors[0].startswith("run_tests (c2): Traceback")
    assert "KeyError: 'currency'" in errors[0]
    assert "fix (assistant): Fixed the KeyError in parse_invoice()" in errors[0]

    assert items(text, "All user messages") == [TASK, *CONSTRAINTS]

    pending = items(text, "Pending tasks")
    assert pending == ['tool call lint (c4) has no result yet: {"path":"src"}']

    current = items(text, "Current work")
    assert current[0] == "Now running the linter on src/api/routes.py."
    assert current[1:] == ['tool call lint({"path":"src"}) -> (no result yet)']

    (step,) = items(text, "Next step")
    assert step.startswith("Wait for the result of lint (c4)")
    # the latest user message is quoted once, under All user messages, and referred to here
    assert step.endswith("the latest user message (quoted under All user messages)")
    assert text.count(CONSTRAINTS[9]) == 1


def test_unanswered_user_messages_are_pending() -> None:
    msgs = [
        *part_one(),
        Message.user("Please also add a CSV header row."),
        Message.user("And gzip the output."),
    ]
    text = ExtractiveSummarizer().summarize(msgs)
    assert items(text, "Pending tasks") == ["unanswered: the latest 2 user messages (quoted under All user messages)"]
    assert items(text, "Next step") == ["Answer the latest user message (quoted under All user messages)"]
    assert items(text, "All user messages")[-2:] == ["Please also add a CSV header row.", "And gzip the output."]
    assert text.count("And gzip the output.") == 1  # quoted once, referred to elsewhere
    assert items(text, "Current work") == ["Understood: InvoiceExporter, and docs in docs/billing/export.md."]


def test_folding_an_earlier_summary_keeps_what_it_said() -> None:
    summarizer = ExtractiveSummarizer()
    one = part_one()
    first = summarizer.summarize(one)
    second = summarizer.summarize([previous_summary(first, len(one)), *part_two()])

    assert headings(second) == HEADINGS
    assert items(second, "Primary request and intent") == [TASK]  # carried, not "Constraint 6"
    keys = [f.split(" \u2014 ")[0] for f in items(second, "Files and code")]
    for ident in IDENTIFIERS:
        assert ident in keys, ident
    assert "/tmp/journal/agent.jsonl" not in second  # the header is not content
    assert items(second, "All user messages") == [TASK, *CONSTRAINTS]  # earlier ones first
    errors = items(second, "Errors and fixes")
    assert len(errors) == 1 and "KeyError" in errors[0]
    assert set(items(first, "Key concepts")) <= set(items(second, "Key concepts"))
    assert items(second, "Current work")[0] == "Now running the linter on src/api/routes.py."
    # no exact repeats anywhere
    for heading in HEADINGS:
        found = items(second, heading)
        assert len(found) == len(set(found))


def test_folding_settles_pending_items() -> None:
    summarizer = ExtractiveSummarizer()
    first = summarizer.summarize(part_two())
    assert any(p.startswith("tool call lint (c4)") for p in items(first, "Pending tasks"))
    later = [
        Message.tool_result("c4", "no lint findings"),
        Message.user("Ship it."),
    ]
    second = summarizer.summarize([previous_summary(first, 10), *later])
    assert items(second, "Pending tasks") == ["unanswered: the latest user message (quoted under All user messages)"]
    assert second.count("Ship it.") == 1
    # no new assistant text: the earlier current work is carried
    assert items(second, "Current work")[0] == "Now running the linter on src/api/routes.py."


def test_a_summary_folded_alone_is_a_fixed_point() -> None:
    summarizer = ExtractiveSummarizer()
    text = summarizer.summarize(part_one() + part_two())
    assert summarizer.summarize([previous_summary(text, 25)]) == text


def test_a_model_written_summary_is_folded_by_its_headings() -> None:
    model_summary = (
        "<analysis>Let me think about what matters.</analysis>\n<summary>\n"
        "## 1. Primary Request and Intent:\n   The user wants the invoice export for PAY-4821.\n"
        "## 3. Files and Code Sections:\n   - src/api/routes.py\n      - the export route lives here\n"
        "## Decisions\n- streaming over buffering\n"
        "## 5. All user messages:\n    - Build the export\n"
        "</summary>"
    )
    text = ExtractiveSummarizer().summarize(
        [Message.user(model_summary, metadata={"cmdc.kind": "summary"}), Message.user("Go on.")]
    )
    assert items(text, "Primary request and intent") == ["The user wants the invoice export for PAY-4821."]
    assert "src/api/routes.py" in items(text, "Files and code")
    assert "the export route lives here" in items(text, "Files and code")
    assert "Decisions: streaming over buffering" in items(text, "Key concepts")
    assert items(text, "All user messages") == ["Build the export", "Go on."]
    assert "Let me think" not in text


def test_a_summary_without_headings_is_not_lost() -> None:
    text = ExtractiveSummarizer().summarize(
        [Message.user("We agreed to use Postgres 16.", metadata={"cmdc.kind": "summary"}), Message.user("Next?")]
    )
    assert "earlier summary: We agreed to use Postgres 16." in items(text, "Key concepts")


def long_session(rounds: int) -> list[Message]:
    msgs = [Message.user(TASK)]
    for r in range(rounds):
        msgs.append(Message.user(f"Round {r:02d}: please also review the next batch of rows and keep it tidy."))
        msgs.append(Message.assistant(f"Reviewed batch {r:02d}."))
    msgs.insert(2, Message.user("Remember parse_invoice() and OPS-1177, and docs/billing/export.md."))
    return msgs


def test_the_budget_drops_the_oldest_user_messages_first_and_says_so() -> None:
    msgs = long_session(60)
    users = [m.text for m in msgs if m.role == "user"]
    summarizer = ExtractiveSummarizer(max_chars=1_500)
    text = summarizer.summarize(msgs)

    assert len(text) <= 1_500
    assert headings(text) == HEADINGS
    assert items(text, "Primary request and intent") == [TASK]
    for ident in ("src/api/routes.py", "PAY-4821", "parse_invoice()", "OPS-1177", "docs/billing/export.md"):
        assert ident in items(text, "Files and code"), ident

    kept = items(text, "All user messages")
    assert kept and kept == users[len(users) - len(kept) :]  # the newest, in order
    notes = [line for line in sections(text)["All user messages"] if not line.startswith("- ")]
    assert notes == [f"({len(users) - len(kept)} older entries are in the journal)"]

    # Folding the trimmed summary again keeps counting what went to the journal.
    more = [Message.user(f"Extra request {i}: keep going with the next batch please.") for i in range(10)]
    again = summarizer.summarize([previous_summary(text, len(msgs)), *more])
    assert len(again) <= 1_500
    assert items(again, "Primary request and intent") == [TASK]
    assert "parse_invoice()" in items(again, "Files and code")
    kept_again = items(again, "All user messages")
    (note,) = [line for line in sections(again)["All user messages"] if not line.startswith("- ")]
    total = len(users) + len(more)
    assert note == f"({total - len(kept_again)} older entries are in the journal)"
    assert kept_again[-1] == more[-1].text


def test_the_smallest_budget_still_holds() -> None:
    msgs = long_session(200) + part_one() + part_two()
    text = ExtractiveSummarizer(max_chars=500).summarize(msgs)
    assert len(text) <= 500
    assert headings(text) == HEADINGS
    assert items(text, "Primary request and intent")


def test_max_chars_is_validated() -> None:
    for bad in (499, 0, -1, 1.5, True, "6000"):
        with pytest.raises(ValueError):
            ExtractiveSummarizer(max_chars=bad)  # type: ignore[arg-type]


def test_same_input_same_output() -> None:
    # Fresh messages (new ids) with the same content give the same summary.
    a = ExtractiveSummarizer().summarize(part_one() + part_two())
    b = ExtractiveSummarizer().summarize(part_one() + part_two())
    assert a == b


async def test_the_callable_and_provider_forms_agree() -> None:
    msgs = part_one() + part_two()
    summarizer = ExtractiveSummarizer()
    direct = summarizer.summarize(msgs)
    assert await summarizer(msgs, DEFAULT_SUMMARY_PROMPT) == direct
    request = ModelRequest(messages=(Message.system(DEFAULT_SUMMARY_PROMPT), Message.user(render_transcript(msgs))))
    reply = await summarizer.complete(request)
    assert reply.role == "assistant" and reply.usage is not None
    assert reply.text == direct


async def test_a_large_input_is_summarized_off_the_event_loop() -> None:
    msgs = [*long_session(10), Message.tool_result("c9", "x" * 250_000)]
    summarizer = ExtractiveSummarizer()
    assert await summarizer(msgs, DEFAULT_SUMMARY_PROMPT) == summarizer.summarize(msgs)


def test_lines_that_are_not_items_do_not_start_with_a_dash() -> None:
    text = ExtractiveSummarizer(max_chars=800).summarize(long_session(30))
    for line in text.splitlines():
        if line and not line.startswith(("## ", "- ")):
            assert re.fullmatch(r"\(none\)|\(\d+ older entr(y is|ies are) in the journal\)", line), line


def test_identifiers_of_many_kinds() -> None:
    text = ExtractiveSummarizer().summarize(
        [
            Message.user(
                "See https://example.com/docs?id=3, ./scripts/run.sh, README.md and Makefile; "
                "call load_config() then ConfigLoader.from_env(); issue #42, host db-stg-07, "
                "module cmdc.compaction.summary, e.g. this, and/or that."
            )
        ]
    )
    keys = items(text, "Files and code")
    assert keys == [
        "https://example.com/docs?id=3",
        "./scripts/run.sh",
        "README.md",
        "Makefile",
        "load_config()",
        "ConfigLoader.from_env()",
        "#42",
        "db-stg-07",
        "cmdc.compaction.summary",
    ]


texts = st.text(st.characters(codec="utf-8"), max_size=300)
message = st.one_of(
    st.builds(Message.user, texts),
    st.builds(Message.assistant, texts),
    st.builds(lambda t, e: Message.tool_result("c1", t, is_error=e), texts, st.booleans()),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(message, max_size=40), st.integers(500, 3_000))
def test_any_input_fits_and_folds(msgs: list[Message], max_chars: int) -> None:
    summarizer = ExtractiveSummarizer(max_chars=max_chars)
    text = summarizer.summarize(msgs)
    assert len(text) <= max_chars
    assert headings(text) == HEADINGS
    assert summarizer.summarize(msgs) == text
    assert summarizer.summarize([previous_summary(text, len(msgs))]) == text  # folding loses nothing
    folded = summarizer.summarize([previous_summary(text, len(msgs)), *msgs[:3]])
    assert len(folded) <= max_chars
    assert headings(folded) == HEADINGS


# -- the scratchpad -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("<analysis>\nthinking\n</analysis>\n\n## Task\n- x\n", "## Task\n- x"),
        ("<ANALYSIS reason='a'>a\nb</Analysis>\n<summary>\n## Task\n- x\n</summary>\n", "## Task\n- x"),
        ("<analysis>one</analysis> keep <analysis>two</analysis>", "keep"),
        ("preamble\n<summary>inside</summary>\ntrailer", "inside"),
        ("<summary>## Task\n- cut off by the token limit", "## Task\n- cut off by the token limit"),
        ("answer first\n<analysis>never closed", "answer first"),
        ("thinking without an opening tag</analysis>\nthe answer", "the answer"),
        ("  plain summary, nothing to strip  \n", "plain summary, nothing to strip"),
        ("<analysis>only a scratchpad</analysis>", "<analysis>only a scratchpad</analysis>"),
        ("<summary>  </summary>", "<summary>  </summary>"),
        ("", ""),
    ],
)
def test_strip_scratchpad(answer: str, expected: str) -> None:
    assert strip_scratchpad(answer) == expected


@pytest.mark.parametrize(
    "texts",
    [
        [
            "\uf47c\U0009bc2díX\x19°b\x8b\U000e79d4\x88ò\xd7𥆃\U000d6366",
            "wÖâ\x0c\U0008da92L\uf6a2e\U0008e693\x05",
            "i[\x15»\U00069bc8\x97\U000844d8û¨\x970Ø\x9d",
            "%²_\x14",
            "\x84&\x8c\x7fè\x82",
        ],
        ["界" * 40 + str(i) for i in range(12)],
    ],
)
def test_multibyte_text_keeps_every_heading(texts: list[str]) -> None:
    # The layout fits UTF-8 bytes, as the clip does: multi-byte text that fits in characters
    # but not in bytes loses items, never a heading (found by hypothesis).
    msgs = [Message.user(t) for t in texts]
    summarizer = ExtractiveSummarizer(max_chars=500)
    text = summarizer.summarize(msgs)
    assert headings(text) == HEADINGS
    assert len(text.encode()) <= 500
    assert summarizer.summarize([previous_summary(text, len(msgs))]) == text


def _identifiers_searching_every_pattern(text: str, *, strong: bool) -> list[str]:
    """`_identifiers` as it was before each pattern got its hint: every pattern searched."""
    from cmdc.providers import extractive

    found: list[tuple[int, str]] = []
    for kind, pattern, _ in extractive._STRONG_KINDS if strong else extractive._ALL_KINDS:
        spans = []
        for match in pattern.finditer(text):
            key = extractive._accept(kind, match)
            if key:
                found.append((match.start(), key))
                spans.append(match.span())
        if spans:
            text = extractive._mask(text, spans)
    found.sort(key=lambda pair: pair[0])
    return [key for _, key in found]


_IDENTIFIER_TEXT = st.lists(
    st.sampled_from([*"aZbYcX09_-./:#()~@+ \n'\"`", "file", "http", "://", "ABC", "Make", ".py", "\u00e9"]), max_size=60
).map("".join)


@settings(max_examples=400, deadline=None)
@given(_IDENTIFIER_TEXT, st.booleans())
def test_a_pattern_skipped_by_its_hint_would_have_found_nothing(text: str, strong: bool) -> None:
    """A pattern is not searched in a text without its hint (a character or a pair that every
    match holds): the identifiers are those every pattern's search finds."""
    from cmdc.providers.extractive import _identifiers

    assert _identifiers(text, strong=strong) == _identifiers_searching_every_pattern(text, strong=strong)


def test_the_hints_on_a_generated_conversation() -> None:
    from cmdc.providers.extractive import _identifiers
    from cmdc.testing import conversation

    texts = [m.text for m in conversation(300, seed=7)]
    texts += ["see https://x.org/a and src/app/main.py, Makefile, JIRA-12, #4, run() a.b.c FooBar foo_bar a-1b"]
    for text in texts:
        for strong in (True, False):
            assert _identifiers(text, strong=strong) == _identifiers_searching_every_pattern(text, strong=strong)

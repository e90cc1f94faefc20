"""The ledger's cheap paths (a bytes table for ASCII text, sentences split line by line) give
what the plain regex and `str.translate` forms give, on any text: ASCII or not, newlines,
sentence marks, punctuation runs."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc.compaction import ledger

_ONE_REGEX = re.compile(r"(?<=[.!?]) +(?=[\"'(\[\w`])|\n+")
"""The sentence split as one regex (a step per character), the reference."""

_PIECES = st.text(
    alphabet=st.sampled_from(list("aZ9_ .!?\n\t\"'(`[-/:@,;*\u2014\u00e9\u03a3\u0130\u00a0")), max_size=80
)
_ANY = st.one_of(st.text(max_size=500), _PIECES)


@settings(max_examples=400, deadline=None)
@given(_ANY)
def test_sentence_split_matches_the_single_regex(text: str) -> None:
    assert [p for p in ledger._split_sentences(text) if p] == [p for p in _ONE_REGEX.split(text) if p]


@settings(max_examples=400, deadline=None)
@given(_ANY)
def test_spaced_matches_translate(text: str) -> None:
    low = text.lower()
    assert ledger._spaced(low) == low.translate(ledger._SPACES)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_ANY, st.text(min_size=390, max_size=420)))
def test_norm_matches_the_regex(text: str) -> None:
    expected = " ".join(ledger._NOT_KEY.sub(" ", text[:400].lower()).split())[:160]
    assert ledger._norm(text) == expected


def test_hostile_texts_read_alike_ascii_or_not() -> None:
    """A message's entries do not depend on which path read it: the same text with one
    non-ASCII character far from its words gives the same keys."""
    plain = "We must keep port 8080. Chose Kafka because it is faster: ok.\n- [ ] ship v2\nTODO: docs"
    accented = plain + " \u00e9"
    keys = [e.key for e in ledger._from_text("user", plain, 1)]
    assert keys and keys == [e.key.removesuffix(" \u00e9") for e in ledger._from_text("user", accented, 1)]


_OUTCOME_PLAIN = re.compile(
    r"(?i)\b(?:passed|failed|errors?|ok|success\w*|done|exit(?:ed)? (?:code|status)?\s*\d+|\d+ (?:tests?|files?))\b"
)
"""The outcome pattern without its first-character lookahead, the reference."""


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        _ANY,
        st.lists(
            st.sampled_from(["PASSED", "failed", "Errors", "ok", "successfully", "Done", "exit code 2", "exited 0",
                             "3 tests", "1 file", "x", " ", "\u0130", "_ok", "ok_", "9", "\n",
                             "\u017f", "\u212a", "\u0663"]),
            max_size=12,
        ).map("".join),
    )
)  # fmt: skip
def test_the_outcome_pattern_finds_what_the_plain_one_finds(text: str) -> None:
    found, plain = ledger._OUTCOME.search(text), _OUTCOME_PLAIN.search(text)
    assert (found and found.span()) == (plain and plain.span())

"""The one clip function: fits its budget in UTF-8 bytes, never longer than its input, never
splits a character; media placeholders."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from cmdc._clip import clip, clip_line, clip_tokens, has_media, image_placeholder, scrub_media, utf8_len
from cmdc.tokens import estimate_text_tokens

texts = st.one_of(
    st.text(),
    st.text(alphabet="漢字かなカナ한국어😀🎉ß", max_size=400),
    st.text(max_size=5_000),
)


@given(texts, st.integers(min_value=-5, max_value=2_000), st.sampled_from(["middle", "head"]))
def test_clip_fits_and_never_grows(text: str, budget: int, keep: str) -> None:
    out = clip(text, budget, keep=keep)  # type: ignore[arg-type]
    budget = max(0, budget)
    size = utf8_len(out)
    assert size <= budget
    assert size <= utf8_len(text)
    assert len(out) <= len(text)
    if utf8_len(text) <= budget:
        assert out == text
    else:
        assert out != text
    out.encode("utf-8")  # whole characters only


@given(texts, st.integers(min_value=0, max_value=500))
def test_clip_tokens_fits_the_estimate(text: str, tokens: int) -> None:
    out = clip_tokens(text, tokens)
    assert estimate_text_tokens(out) <= tokens
    assert estimate_text_tokens(out) <= estimate_text_tokens(text)


@given(texts, st.integers(min_value=0, max_value=300))
def test_clip_line_is_one_line(text: str, budget: int) -> None:
    out = clip_line(text, budget)
    assert utf8_len(out) <= budget
    assert not any(c.isspace() and c != " " for c in out)


def test_cjk_and_emoji_are_cut_in_bytes() -> None:
    text = "漢" * 1_000  # 3,000 bytes
    out = clip(text, 300)
    assert utf8_len(out) <= 300 and "bytes clipped" in out
    assert out.startswith("漢") and out.endswith("漢")
    emoji = "😀" * 100  # 400 bytes
    assert utf8_len(clip(emoji, 41, keep="head")) <= 41


def test_the_marker_counts_what_was_cut() -> None:
    text = "a" * 500 + "b" * 500
    out = clip(text, 200)
    omitted = int(out.split("[… ")[1].split(" ")[0])
    head, _, rest = out.partition(" [… ")
    tail = rest.rpartition(" …] ")[2]
    assert omitted == 1000 - len(head) - len(tail)
    assert omitted > 0


def test_a_short_text_never_comes_out_longer() -> None:
    assert clip("abc", 2) == "ab"
    assert clip("abcdef", 5) == "abcde"  # no room for a marker: the bare head
    assert clip("", 0) == ""


def test_data_urls_and_base64_runs_become_placeholders() -> None:
    payload = base64.b64encode(bytes(range(256)) * 1_600).decode()  # ~546 KB of base64
    text = f"look at this: data:image/png;base64,{payload} thanks"
    out = scrub_media(text, "message m1")
    assert payload[:100] not in out and "image/png" in out and "KB omitted" in out and "message m1" in out
    assert out.startswith("look at this: ") and out.endswith(" thanks")
    raw = "blob " + payload + " end"
    assert "binary data" in scrub_media(raw) and payload[:100] not in scrub_media(raw)
    assert not has_media("plain words " * 100)
    assert scrub_media("short c29tZQ==") == "short c29tZQ=="
    placeholder = image_placeholder(f"data:image/png;base64,{payload}", None, "journal records 3-9")
    assert payload[:50] not in placeholder and "image/png" in placeholder and "records 3-9" in placeholder
    assert "https://x.test/a.png" in image_placeholder("https://x.test/a.png", "image/png")


@given(
    st.lists(st.sampled_from([b" ", b"a", b"Z9", b"+/", b"-_", b"=", b"\xc3\xa9", b"A" * 300]), max_size=40),
    st.integers(min_value=0, max_value=80),
)
def test_the_base64_precheck_is_the_regex_it_replaced(parts: list[bytes], step: int) -> None:
    """`may_hold_base64` looks a step at a time (runs across a step's end count): the same
    answer as one regex over the whole (512 base64 bytes in a row)."""
    import re

    from cmdc import _clip

    data = b"".join(parts)
    old = _clip._STEP
    _clip._STEP = max(1, step)
    try:
        assert _clip.may_hold_base64(data) == (re.search(rb"[A-Za-z0-9+/_-]{512}", data) is not None)
    finally:
        _clip._STEP = old


def test_the_token_estimate_of_ascii_text_is_its_length() -> None:
    for text in ["", "a", "abcd" * 1000 + "x", "é", "😀 ok", "\x00\x7f"]:
        assert estimate_text_tokens(text) == (len(text.encode()) + 3) // 4


def _clip_encoding_all(text: str, max_bytes: int, keep: str, marker: str) -> str:
    """The clip function as it was (it encoded the whole text): the reference."""
    from cmdc._clip import _head, _tail

    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    if max_bytes <= 0:
        return ""
    room = max_bytes - len(marker.format(omitted=len(data), note="").encode())
    if room <= 0:
        return _head(data, max_bytes)
    if keep == "head":
        head = _head(data, room)
        out = head + marker.format(omitted=len(data) - len(head.encode()), note="")
    else:
        head, tail = _head(data, room - room // 2), _tail(data, room // 2)
        out = head + marker.format(omitted=len(data) - len(head.encode()) - len(tail.encode()), note="") + tail
    return out if len(out) < len(text) else _head(data, max_bytes)


@given(
    st.lists(st.sampled_from(["a", "é", "😀", " ", "\ud800", "xyz"]), max_size=80).map("".join),
    st.integers(min_value=0, max_value=60),
    st.sampled_from(["middle", "head"]),
    st.sampled_from([" [… {omitted} …] ", "", "[{omitted}]"]),
)
def test_clip_encodes_only_the_ends_of_a_long_text(text: str, max_bytes: int, keep: str, marker: str) -> None:
    from cmdc import _clip

    old = _clip._SLICE
    _clip._SLICE = 3
    try:
        got = clip(text, max_bytes, keep=keep, marker=marker)  # type: ignore[arg-type]
    finally:
        _clip._SLICE = old
    assert got == _clip_encoding_all(text, max_bytes, keep, marker)

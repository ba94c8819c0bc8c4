"""The redactor a run's output passes through (orbit.runtime.redact), by properties: whatever
the values (overlapping, unicode, one inside another) and however the text is cut into chunks,
no value and no base64 or URL encoding of one comes out, and the chunked output is the output
of the whole text at once; text without values comes out as it went in."""

from __future__ import annotations

import base64
import itertools
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.runtime.redact import MASK, Redactor, forms_of

secret = st.text(min_size=3, max_size=24).map(str.encode).filter(lambda b: len(b) >= 3)
noise = st.binary(max_size=60)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def redacted(redactor: Redactor, chunks: list[bytes], pauses: bool = False) -> bytes:
    """The chunks through the redactor; with `pauses`, released after every other one (as a
    live log is when the output pauses)."""
    out = []
    for i, chunk in enumerate(chunks):
        out.append(redactor.feed(chunk))
        if pauses and i % 2:
            out.append(redactor.release())
    return b"".join(out) + redactor.flush()


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(secret, min_size=1, max_size=3),
    pieces=st.lists(st.tuples(noise, st.integers(0, 2), st.integers(0, 3)), max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_no_value_or_encoding_survives_any_chunking(
    values: list[bytes], pieces: list[tuple[bytes, int, int]], cuts: list[int]
) -> None:
    text = b""
    for filler, which, form in pieces:
        value = values[which % len(values)]
        shown = [
            value,
            base64.b64encode(value),
            base64.urlsafe_b64encode(b"x" + value),
            quote(value.decode(), safe="").encode(),
        ][form]
        text += filler + shown
    whole = Redactor(values).text(text)
    assert redacted(Redactor(values), chunked(text, cuts)) == whole
    assert redacted(Redactor(values), chunked(text, cuts), pauses=True) == whole
    for value in values:
        for form in forms_of(value):  # the value, its base64 at 3 alignments, URL-encoded
            assert form not in whole or b"*" in form


@settings(max_examples=200, deadline=None)
@given(values=st.lists(secret, min_size=1, max_size=3), text=noise, cuts=st.lists(st.integers()))
def test_text_without_a_value_goes_through_unchanged(
    values: list[bytes], text: bytes, cuts: list[int]
) -> None:
    redactor = Redactor(values)
    if any(f in text for v in values for f in forms_of(v)):
        return
    assert redacted(redactor, chunked(text, cuts)) == text
    assert redacted(Redactor(values), chunked(text, cuts), pauses=True) == text


def test_overlapping_values_and_a_value_split_across_chunks() -> None:
    redactor = Redactor([b"xyzab", b"abc"])
    assert redactor.text(b"1 xyzabc 2") == b"1 " + MASK + b" 2"
    redactor = Redactor(["tøkén-ünïcode".encode()])
    data = "log: tøkén-ünïcode!\n".encode()
    out = b"".join(redactor.feed(data[i : i + 1]) for i in range(len(data)))
    assert out + redactor.flush() == b"log: " + MASK + b"!\n"
    # a pause releases all but what may begin a value: what is whole shows at once
    redactor = Redactor([b"hf_secret"])
    assert redactor.feed(b"sha: 0123456789abcdef") == b"sha: 01234"  # held: may begin one
    assert redactor.release() == b"56789abcdef"
    assert redactor.feed(b" hf_se") + redactor.release() == b" "
    assert redactor.feed(b"cret.") + redactor.flush() == MASK + b"."
    # a value too short to look for is left alone: a one-letter value would take the log
    assert Redactor([b"ab"]).text(b"abc") == b"abc"

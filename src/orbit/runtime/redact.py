"""Secrets' values taken out of text as it is written: every occurrence of a value, of its
base64 (standard and URL-safe, at each of the three alignments it can have inside a longer
base64 text) and of its URL encoding becomes `***`, also where a chunk ends in the middle of
one. It runs where a run's output is captured (the wrapper, on a bare host: Python 3.8 and the
standard library only) and where ORBIT shows or keeps text.

    redactor = Redactor([b"hf_abc...", b"wandb-key"])
    out.write(redactor.feed(chunk))   # as chunks come; holds back what may be a value's start
    out.write(redactor.release())     # the output paused: all but what may begin a value
    out.write(redactor.flush())       # at the end

Values shorter than MIN_VALUE bytes are not looked for (a one-letter value would take every
such letter out of the log), nor encoded forms shorter than MIN_FORM."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

MASK = b"***"
MIN_VALUE = 3
MIN_FORM = 6
MAX_HELD = 1 << 20  # a run of overlapping values held back this long is masked as it is


def _base64_forms(value: bytes) -> set[bytes]:
    """The characters of `value`'s base64 that depend on its bytes alone, at each alignment."""
    forms = set()
    n = len(value)
    for k in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b"\0" * k + value).rstrip(b"=")
            first = -(-8 * k // 6)  # the first character whose bits are all value's
            last = (8 * (k + n)) // 6  # the characters before this one end within value
            forms.add(text[first:last])
    return forms


def forms_of(value: bytes) -> set[bytes]:
    """What is looked for in place of one value: itself and its encodings."""
    if len(value) < MIN_VALUE:
        return set()
    forms = {value}
    forms.update(f for f in _base64_forms(value) if len(f) >= MIN_FORM)
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        for encoded in (quote(text, safe=""), quote_plus(text, safe=""), quote(text)):
            forms.add(encoded.encode("ascii"))
    return forms


class Redactor:
    def __init__(self, values: Iterable[bytes]) -> None:
        forms: set[bytes] = set()
        for value in values:
            forms.update(forms_of(value))
        ordered: list[bytes] = sorted(forms, key=lambda f: (-len(f), f))  # longest first
        self.forms = ordered
        # at every position, the longest form that starts there: overlapping values (one's end
        # another's start) are each found, and the union of what they cover is masked
        alternatives = b"|".join(re.escape(f) for f in ordered)
        self.pattern = re.compile(b"(?=(" + alternatives + b"))") if ordered else None
        self.hold = max((len(f) for f in ordered), default=1) - 1
        self.tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """`chunk` with every value masked, less its last bytes that may begin a value (given
        back by the next feed, or by flush)."""
        data = self.tail + chunk
        out, self.tail = self._mask(data, final=len(data) > MAX_HELD)
        return out

    def release(self) -> bytes:
        """What is held back, masked, except its end that may begin a value (to be decided
        by what comes next): a live log shows what is whole while the output pauses, and
        the text put together is still the whole text's, masked."""
        out, self.tail = self._mask(self.tail, final=False, keep=self._may_begin(self.tail))
        return out

    def _may_begin(self, data: bytes) -> int:
        """The length of the longest end of `data` that some form begins with."""
        best = 0
        for form in self.forms:
            first = form[:1]
            at = data.find(first, max(len(data) - len(form) + 1, 0))
            while at != -1 and len(data) - at > best:
                if form.startswith(data[at:]):
                    best = len(data) - at
                    break
                at = data.find(first, at + 1)
        return best

    def flush(self) -> bytes:
        """What is held back, masked: the end of the text."""
        out, self.tail = self._mask(self.tail, final=True)
        return out

    def text(self, data: bytes) -> bytes:
        """Mask a whole text at once."""
        return self.feed(data) + self.flush()

    def _mask(self, data: bytes, final: bool, keep: int | None = None) -> tuple[bytes, bytes]:
        """(what can be written of `data`, masked; the rest, held back). A value that may go on
        past the end of `data` is held back whole, with every value that overlaps it, unless
        this is the end of the text (`final`). `keep`: the end that may begin a value (by
        default as long as the longest form, less a byte)."""
        if self.pattern is None:
            return data, b""
        # a form that starts at or after `seen` may run past the end, unseen: decided later
        hold = self.hold if keep is None else keep
        seen = len(data) if final else max(len(data) - hold, 0)
        out = []
        at = 0  # what is written so far
        start = end = -1  # the covered span being gathered
        for found in self.pattern.finditer(data):
            s, e = found.start(), found.start() + len(found.group(1))
            if s >= seen and s >= end:
                break
            if s >= end:  # a new span (one that only touches the last is its own)
                if end >= 0:
                    out += [data[at:start], MASK]
                    at = end
                start = s
            end = max(end, e)
        if end >= 0:
            if end > seen and not final:  # a value overlapping it may go on: hold it all
                out.append(data[at:start])
                return b"".join(out), data[start:]
            out += [data[at:start], MASK]
            at = end
        cut = max(seen, at)
        out.append(data[at:cut])
        return b"".join(out), data[cut:]

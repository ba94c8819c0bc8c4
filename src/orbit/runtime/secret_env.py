"""A run's secrets in its wrapper: read once before the task starts, given to the task as
ordinary environment variables, and masked (`***`) out of all that the wrapper writes.

They come on the wrapper's stdin (`--secrets -`: a launch on this machine, an agent's, an SSH
host's, where the launcher's own process hands them over) or in a file of mode 0600 that is
deleted as it is read (`--secrets PATH`: a Slurm job, whose wrapper no launcher starts), as one
JSON object of names to values. Neither a command line nor the wrapper's own environment ever
holds a value, and after the read nothing on disk does.

The task's output reaches artifacts/training.log through a pipe and the redactor
(scripts/orbit_redact.py): what is on disk, so its sha256 in the manifest and every copy of it
ORBIT keeps or shows, is already masked. Files the task writes itself are its own.

It travels inside a bundle that names secrets (scripts/orbit_secret_env.py) and needs nothing
but python3's standard library (3.8 and later)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # as mypy reads it
    from orbit.runtime import redact
else:
    try:  # in a bundle: beside this file in scripts/
        import orbit_redact as redact
    except ImportError:  # as part of the orbit package
        from orbit.runtime import redact

CHUNK = 1 << 16
PAUSE_S = 0.2  # output paused this long: what cannot begin a value is written
PUMP_JOIN_S = 10.0  # how long the end of the task's output is waited for after it exited


def read(source: str) -> dict[str, str]:
    """The secrets from stdin (`-`) or from the file `source`, which is deleted first thing,
    whatever it holds. SystemExit in one line (never a value) when they cannot be read."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.unlink(source)
                with os.fdopen(fd, "rb") as f:
                    fd = -1
                    data = f.read()
            finally:
                if fd >= 0:
                    os.close(fd)
    except OSError as exc:
        raise SystemExit(f"orbit wrapper: cannot read the run's secrets: {exc.strerror}") from None
    try:
        found = json.loads(data.decode("utf-8")) if data.strip() else {}
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        raise SystemExit("orbit wrapper: the run's secrets are not a JSON object of strings")
    return found


def _write(out: Any, data: bytes) -> None:
    """`data` into the log, flushed for those who follow it; a write that fails (a full disk)
    loses that much of the log, never the task (its pipe is still read)."""
    if out is None or not data:
        return
    with contextlib.suppress(OSError):
        out.write(data)
        out.flush()


class Masked:
    """What the wrapper writes, with the secrets' values (and their encodings) masked."""

    def __init__(self, values: dict[str, str]) -> None:
        raw = [v.encode("utf-8") for v in values.values()]
        self.stream = redact.Redactor(raw)  # the task's output, as it comes (the pump's)
        self.whole = redact.Redactor(raw)  # whole texts, in the wrapper's own thread
        self.pump: threading.Thread | None = None

    def text(self, text: str) -> str:
        """A whole text masked (a line of the runtime log, a result's message)."""
        return self.whole.text(text.encode("utf-8", "replace")).decode("utf-8", "replace")

    def fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {k: self.text(v) if isinstance(v, str) else v for k, v in fields.items()}

    def file(self, path: str) -> None:
        """A file the wrapper's sidecars wrote (the precheck's log), masked in place."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return
        masked = self.whole.text(data)
        if masked != data:
            tmp = f"{path}.masking"
            with open(tmp, "wb") as f:
                f.write(masked)
            os.replace(tmp, path)

    def start_pump(self, read_fd: int, log_path: str, opener: Any) -> None:
        """The task's output, from the read end of its pipe into `log_path`, masked as it
        comes (a value split between two reads is still found)."""

        def pump() -> None:
            try:
                out = open(log_path, "ab", opener=opener)  # noqa: SIM115 - closed below
            except OSError:
                out = None  # nowhere to write: the output is still read, so the task goes on
            try:
                while True:
                    if not select.select([read_fd], [], [], PAUSE_S)[0]:
                        _write(out, self.stream.release())  # paused: what is whole
                        continue
                    chunk = os.read(read_fd, CHUNK)
                    if not chunk:
                        break
                    _write(out, self.stream.feed(chunk))  # followed live
                _write(out, self.stream.flush())
            finally:
                os.close(read_fd)
                if out is not None:
                    with contextlib.suppress(OSError):
                        out.close()

        self.pump = threading.Thread(target=pump, name="orbit-masked-output", daemon=True)
        self.pump.start()

    def end_pump(self) -> bool:
        """Wait for the end of the task's output (every writer of the pipe gone); False when
        something the task left behind still holds it after PUMP_JOIN_S."""
        if self.pump is None:
            return True
        self.pump.join(PUMP_JOIN_S)
        return not self.pump.is_alive()

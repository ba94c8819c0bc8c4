"""What the console reads of an attempt's folder, wherever it ran: its charts' data (the NVML
audit and logging.jsonl, cut to a screen's width by orbit.forensics.series), its sealed
artifacts (the manifest's paths, sizes and sha256) and one of them, the previews the task
writes as they arrive (artifacts/previews/), and a log's bytes before an offset (the page shows
a log's end first and older parts on demand)."""

from __future__ import annotations

import json
from typing import Any

from orbit.core.control.base import ServicePart, attempt_of
from orbit.forensics.progress import PROGRESS_GLOB
from orbit.model.errors import InvalidInput, NotFound, Unreachable
from orbit.model.layers import LogLayer
from orbit.model.records import AttemptRecord

MANIFEST = "artifacts/manifest.json"
PREVIEWS = "artifacts/previews/*"
PREVIEW_BYTES = 2 * 1024 * 1024  # a preview larger than this is not shown (collect it)
PREVIEWS_SHOWN = 24  # the most previews a page lists (the first by name)
PREVIEW_TAIL = 8 * 1024  # what of each preview a listing reads (a text's end)
ARTIFACT_BYTES = 64 * 1024 * 1024  # the most one artifact download reads (more: orbit collect)
EARLIER_BYTES = 64 * 1024  # what one "older" step of a log brings


class LogFollower:
    """One attempt's log read straight from where it runs, for a stream that follows it: the
    attempt is looked up once (and again only until it has a folder), so a poll that finds
    nothing new costs a read of the file, not of the store; `ended` asks the store."""

    def __init__(self, files: AttemptFiles, ref: str, layer: LogLayer, attempt: int) -> None:
        self.files, self.ref, self.layer, self.number = files, ref, layer, attempt
        self.found = files._attempt(ref, attempt)

    def read(self, offset: int) -> bytes:
        if self.found.handle is None:  # not placed yet: look again
            self.found = self.files._attempt(self.ref, self.number)
            if self.found.handle is None:
                return b""
        backend = self.files.execution.backend(self.found.backend_key)
        data, _ = backend.read_log(self.found.handle, self.layer, offset)
        return data

    def ended(self) -> bool:
        return self.files.store.runs.get_attempt(self.found.id).state.terminal


class AttemptFiles(ServicePart):
    def log_follower(self, ref: str, layer: LogLayer, attempt: int) -> LogFollower:
        return LogFollower(self, ref, layer, attempt)

    def _attempt(self, ref: str, attempt: int | None) -> AttemptRecord:
        return attempt_of(self.store.runs.get_run(ref), attempt)

    def charts(self, ref: str, attempt: int | None = None) -> dict[str, Any]:
        """Its attempt's GPUs over the NVML audit (the whole run a minute a point, its last
        minutes a second a point), and its loss over steps; empty where the attempt has no
        folder yet or its host does not answer now. Parsing the audit is most of a run page's
        cost: the console keeps what this gives a while for all who look
        (orbit.server.ui.live)."""
        from orbit.forensics.series import (
            LOSS_TAIL_BYTES,
            NVML_FILE,
            NVML_MINUTES_BYTES,
            NVML_MINUTES_FILE,
            NVML_TAIL_BYTES,
            gpu_series,
            loss_series,
        )

        found = self._attempt(ref, attempt)
        charts: dict[str, Any] = {"gpus": {}, "unavailable": None, "loss": [[], []]}
        if found.handle is None:
            return charts
        backend = self.execution.backend(found.backend_key)
        try:
            nvml = backend.tail_files(found.handle, NVML_FILE, NVML_TAIL_BYTES)
            minutes = backend.tail_files(found.handle, NVML_MINUTES_FILE, NVML_MINUTES_BYTES)
            logged = backend.tail_files(found.handle, PROGRESS_GLOB, LOSS_TAIL_BYTES)
        except Unreachable:
            return charts
        joined = b"".join(minutes.values())
        charts.update(gpu_series(b"".join(nvml.values()), minutes=joined))
        if logged:
            charts["loss"] = loss_series(logged[sorted(logged)[0]])
        return charts

    def gpu_window(
        self, ref: str, start: float, end: float, attempt: int | None = None
    ) -> dict[str, Any]:
        """Its attempt's GPUs between `start` and `end` (epoch seconds, at most ZOOM_MAX_S
        apart) second by second, found in the NVML audit by a few ranged reads however long
        it is: a chart zoomed into a part of a day-long run."""
        from orbit.forensics.series import NVML_FILE, ZOOM_MAX_S, gpu_window

        if not end > start:
            raise InvalidInput(f"to: {end} is not after from: {start}")
        if end - start > ZOOM_MAX_S:
            raise InvalidInput(
                f"to - from: {end - start:.0f} s; a zoom at full resolution spans at most "
                f"{ZOOM_MAX_S:.0f} s"
            )
        found = self._attempt(ref, attempt)
        empty: dict[str, Any] = {"gpus": {}, "unavailable": None, "from": start, "to": end}
        if found.handle is None:
            return empty
        backend, handle = self.execution.backend(found.backend_key), found.handle

        def read(offset: int, limit: int) -> bytes:
            return backend.read_range(handle, NVML_FILE, offset, limit)[0]

        try:
            _, size = backend.read_range(handle, NVML_FILE, 0, 0)
            return gpu_window(read, size, start, end) if size else empty
        except Unreachable:
            return empty

    def artifacts(self, ref: str, attempt: int | None = None) -> list[dict[str, Any]] | None:
        """The sealed manifest's entries (path, size, sha256), or None before the attempt has
        ended (the wrapper seals it then: until then the file is the task's to write, and
        nothing in it is believed) or while its host does not answer."""
        found = self._attempt(ref, attempt)
        if found.handle is None or not found.state.terminal:
            return None
        try:
            raw = self.execution.backend(found.backend_key).read_file(found.handle, MANIFEST)
        except Unreachable:
            return None
        try:
            entries = json.loads(raw or b"null")
        except ValueError:
            return None
        if isinstance(entries, dict):
            entries = entries.get("files", entries.get("entries"))
        if not isinstance(entries, list):
            return None
        return [
            {"path": e["path"], "size": _count(e.get("size")), "sha256": str(e.get("sha256", ""))}
            for e in entries
            if isinstance(e, dict) and isinstance(e.get("path"), str) and inside(e["path"])
        ]

    def artifact(self, ref: str, path: str, attempt: int | None = None) -> bytes:
        """One artifact the manifest lists, whole (at most ARTIFACT_BYTES)."""
        listed = {e["path"]: e for e in self.artifacts(ref, attempt) or []}
        entry = listed.get(path)
        if entry is None or not inside(path):
            raise NotFound(f"run {ref} has no sealed artifact '{path}'")
        if entry["size"] > ARTIFACT_BYTES:
            raise InvalidInput(
                f"'{path}' is {entry['size']:,} bytes, more than a page downloads: "
                f"orbit collect {ref}"
            )
        found = self._attempt(ref, attempt)
        assert found.handle is not None
        data = self.execution.backend(found.backend_key).read_file(
            found.handle, f"artifacts/{path}"
        )
        if data is None:
            raise NotFound(f"'{path}' is no longer where run {ref} ran: orbit collect {ref}")
        if len(data) > ARTIFACT_BYTES:
            raise InvalidInput(f"'{path}' is larger than a page downloads: orbit collect {ref}")
        return data

    def previews(self, ref: str, attempt: int | None = None) -> dict[str, bytes]:
        """artifacts/previews/NAME -> the end of it (PREVIEW_TAIL bytes), for the first
        PREVIEWS_SHOWN by name."""
        found = self._attempt(ref, attempt)
        if found.handle is None:
            return {}
        backend = self.execution.backend(found.backend_key)
        try:
            tails = backend.tail_files(found.handle, PREVIEWS, PREVIEW_TAIL)
        except Unreachable:
            return {}
        names = sorted(tails)[:PREVIEWS_SHOWN]
        return {name.rsplit("/", 1)[-1]: tails[name] for name in names}

    def preview(self, ref: str, name: str, attempt: int | None = None) -> bytes:
        """One preview whole (an image), if it is at most PREVIEW_BYTES."""
        found = self._attempt(ref, attempt)
        if "/" in name or not inside(name) or any(c in name for c in "*?[]") or not found.handle:
            raise NotFound(f"run {ref} has no preview '{name}'")
        backend, path = self.execution.backend(found.backend_key), f"artifacts/previews/{name}"
        try:
            tails = backend.tail_files(found.handle, path, PREVIEW_BYTES + 1)
        except Unreachable as exc:
            raise NotFound(f"run {ref}'s host does not answer now: {exc}") from None
        data = tails.get(path)
        if data is None:
            raise NotFound(f"run {ref} has no preview '{name}'")
        if len(data) > PREVIEW_BYTES:
            raise InvalidInput(f"preview '{name}' is larger than a page shows: orbit collect {ref}")
        return data

    def log_before(
        self, ref: str, layer: LogLayer, offset: int, attempt: int | None = None
    ) -> tuple[bytes, int]:
        """The whole lines of a log that end at `offset`, about EARLIER_BYTES of them, and the
        offset they start at (0: the log's start)."""
        found = self._attempt(ref, attempt)
        start = max(0, offset - EARLIER_BYTES)
        data = b""
        if found.handle is None:
            return data, 0
        backend = self.execution.backend(found.backend_key)
        while len(data) < offset - start:
            chunk, _ = backend.read_log(found.handle, layer, start + len(data))
            if not chunk:
                break
            data += chunk
        data = data[: offset - start]
        if start > 0:  # the first line is cut: it comes whole with the next step back
            cut = data.find(b"\n") + 1
            start, data = start + cut, data[cut:]
        return data, start


def inside(path: str) -> bool:
    """A relative path that stays where it is put: no empty, `.` or `..` part, not absolute,
    no NUL or backslash (a manifest is the task's words until its attempt ends; even after,
    a path from it never leaves artifacts/)."""
    parts = path.split("/")
    return (
        0 < len(path) <= 4096
        and "\x00" not in path
        and "\\" not in path
        and all(part not in ("", ".", "..") for part in parts)
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

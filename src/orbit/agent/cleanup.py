"""A node's work dir, kept from filling up. An attempt's folder goes once the attempt has ended
and every file of it is on the control plane, sealed there (its marker says `done`: the
server took the last report without asking for more): `--clean-after` (a day) after it
ended, or at once, oldest first, while the work dir's filesystem has less than `--min-free`
(10%) free; then, while still short of room, cached bundles, least recently fetched first
(a later start fetches one again by digest). Never an attempt that still runs or is being
launched (a launch may copy an earlier attempt's checkpoint from its folder), never one whose
files are not all uploaded, never a bundle a live attempt's job matches.

The server also tells an agent to remove attempts (`orbit runs delete`, retention, gc): the
same removal, whatever their age or uploads, but never one that still runs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orbit.runtime import hostside

log = logging.getLogger("orbit.agent.cleanup")

TRASH = ".removing-"


@dataclass(frozen=True)
class CleanupOptions:
    clean_after_s: float = 86400.0  # --clean-after: an ended, uploaded attempt's folder stays
    min_free: float = 0.10  # --min-free: below this share free, clean whatever may go now
    every_s: float = 10.0  # how often the work dir is looked at (sooner for a short clean_after)


class AgentView(Protocol):
    """What the cleaner reads of the agent (orbit.agent.state.AgentState, which makes it)."""

    work: Path
    attempts_dir: Path
    bundles_dir: Path
    lock: threading.RLock
    tracked: dict[str, Any]
    users: Any
    stop: threading.Event


class WorkDirCleaner:
    def __init__(self, agent: AgentView, options: CleanupOptions) -> None:
        self.agent, self.o = agent, options

    def loop(self) -> None:
        every = max(0.5, min(self.o.every_s, self.o.clean_after_s / 2))
        while not self.agent.stop.wait(every):
            try:
                self.sweep()
            except Exception:  # a folder gone mid-look, say: the next look tries again
                log.exception("cleaning the work dir failed")

    # --- by age and free space -------------------------------------------------------------

    def sweep(self, now: float | None = None) -> list[str]:
        """One look: what it removed (attempt ids, then `bundle DIGEST`)."""
        at = time.time() if now is None else now
        removed = []
        for ended, attempt_id in sorted(self._sealed()):
            short = self._short_of_room()
            if not short and at - ended < self.o.clean_after_s:
                continue
            if self._remove(attempt_id):
                why = "free space low" if short else "ended and uploaded"
                log.info("removed attempt %s's folder (%s)", attempt_id, why)
                removed.append(attempt_id)
        if self._short_of_room():
            removed += self._drop_bundles()
        self._drop_stale_resumes(at)
        return removed

    def _short_of_room(self) -> bool:
        usage = shutil.disk_usage(self.agent.work)
        return usage.total > 0 and usage.free / usage.total < self.o.min_free

    def _sealed(self) -> list[tuple[float, str]]:
        """(when it ended, id) of each attempt here that ended with all its files uploaded."""
        found = []
        for marker in self.agent.attempts_dir.glob("*.json"):
            try:
                data = json.loads(marker.read_text())
                attempt_id = str(data["attempt_id"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            result = self.agent.attempts_dir / attempt_id / "runtime" / "result.json"
            if data.get("done") and marker.stem == attempt_id and result.is_file():
                found.append((result.stat().st_mtime, attempt_id))
        return found

    # --- told by the server ----------------------------------------------------------------

    def remove(self, attempt_ids: Iterable[str]) -> list[str]:
        """The server's word (a run deleted, its artifacts expired): each folder that no
        longer runs goes, uploaded or not."""
        removed = []
        for attempt_id in attempt_ids:
            if self._remove(attempt_id, sealed_only=False):
                log.info("removed attempt %s's folder (the server's word)", attempt_id)
                removed.append(attempt_id)
        return removed

    # --- removing ----------------------------------------------------------------------------

    def _remove(self, attempt_id: str, sealed_only: bool = True) -> bool:
        """Set the folder aside under the agent's lock (so that no launch begins to read it
        meanwhile), then remove it; False if it may not go now."""
        folder = self.agent.attempts_dir / attempt_id
        with self.agent.lock:
            tracked = self.agent.tracked.get(attempt_id)
            if self._busy(attempt_id, folder, tracked, sealed_only):
                return False
            aside = self._set_aside(folder)
            self.agent.tracked.pop(attempt_id, None)
            for extra in (f"{attempt_id}.json", f"{attempt_id}.cpus"):
                (self.agent.attempts_dir / extra).unlink(missing_ok=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return True

    def _busy(self, attempt_id: str, folder: Path, tracked: Any, sealed_only: bool) -> bool:
        if any(getattr(t, "launching", False) for t in self.agent.tracked.values()):
            return True  # a launch may copy a checkpoint from an earlier attempt's folder
        if tracked is not None and (not getattr(tracked, "done", False) and sealed_only):
            return True
        if hostside.wrapper_alive(str(folder / "runtime")):
            return True
        users = self.agent.users
        return users is not None and users.uid_of(attempt_id) is not None

    def _set_aside(self, folder: Path) -> Path | None:
        if not folder.exists():
            return None
        aside = folder.with_name(f"{TRASH}{folder.name}-{uuid.uuid4().hex[:8]}")
        os.rename(folder, aside)
        return aside

    def _drop_bundles(self) -> list[str]:
        """Cached bundles while the work dir is short of room, least recently fetched first,
        but none whose job.json a live attempt's matches."""
        removed = []
        live = self._live_jobs()
        bundles = [b for b in self.agent.bundles_dir.iterdir() if not b.name.startswith(".")]
        for bundle in sorted(bundles, key=lambda b: b.stat().st_mtime):
            if not self._short_of_room():
                break
            if _job_digest(bundle) in live:
                continue
            with self.agent.lock:  # no launch is reading it: set aside in one step
                if any(getattr(t, "launching", False) for t in self.agent.tracked.values()):
                    break
                aside = self._set_aside(bundle)
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
                log.info("removed cached bundle %s (free space low)", bundle.name[:12])
                removed.append(f"bundle {bundle.name}")
        return removed

    def _live_jobs(self) -> set[str]:
        with self.agent.lock:
            ids = list(self.agent.tracked)
        return {
            _job_digest(self.agent.attempts_dir / attempt_id)
            for attempt_id in ids
            if hostside.wrapper_alive(str(self.agent.attempts_dir / attempt_id / "runtime"))
        } - {""}

    def _drop_stale_resumes(self, at: float) -> None:
        """Checkpoints staged for a start that never took them (its agent died meanwhile)."""
        for staged in self.agent.attempts_dir.glob(".resume-*"):
            if at - staged.stat().st_mtime >= self.o.clean_after_s:
                shutil.rmtree(staged, ignore_errors=True)
        for folder in (self.agent.attempts_dir, self.agent.bundles_dir):
            for aside in folder.glob(f"{TRASH}*"):
                shutil.rmtree(aside, ignore_errors=True)  # a removal a crash cut short


def _job_digest(folder: Path) -> str:
    try:
        return hashlib.sha256((folder / "job.json").read_bytes()).hexdigest()
    except OSError:
        return ""

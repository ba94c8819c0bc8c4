"""The scheduler config as it is live: read from its file (ORBIT_SCHEDULER_CONFIG, else
$ORBIT_HOME/scheduler.yaml), looked at again whenever a pass asks for it (a stat; the file is
read and hashed only when the stat changed), so that an edit is picked up without a restart.

A new config is taken only once it is valid (its YAML, every key, the site checks it names).
An invalid one leaves the last good config live, says so once in the log, and is shown with
the time it was first seen (`orbit sched config show`, the `orbit_scheduler_config_invalid`
metric): placement never stops on a typo. The last good config is kept in the store, so a
restart with a broken file starts from it, and every change (an edit of the file, or
`orbit sched config set`, which validates before it writes) is audited with who, when and
the diff, once, whichever replica saw it first."""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import pwd
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orbit.model.errors import InvalidInput, OrbitError, Refused

if TYPE_CHECKING:
    from orbit.core.control.views import SchedConfigView
    from orbit.scheduler.model import Quota, SchedConfig
    from orbit.store import Store

log = logging.getLogger("orbit.scheduler.config")
DIFF_CHARS = 16_000  # the most of a diff an audit event keeps


@dataclass(frozen=True)
class Live:
    """The config in force: its text as written ("" for the defaults), validated mapping,
    where it came from, and who made it so, when."""

    text: str
    digest: str
    data: dict[str, Any]
    source: str
    set_by: str
    set_at: datetime


@dataclass(frozen=True)
class ConfigError:
    """A config that was refused: the one line naming the key, since when, which text."""

    line: str
    digest: str
    since: datetime


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def validate(text: str, source: str) -> dict[str, Any]:
    """The mapping `text` holds if it is a config the scheduler can run on, else InvalidInput
    in one line naming `source` and the key."""
    from orbit.model.yamlio import parse_yaml_mapping
    from orbit.scheduler.config import config_from_dict
    from orbit.scheduler.plugins import site_checks

    data = parse_yaml_mapping(text, source) if text.strip() else {}
    config = config_from_dict(data, source)
    try:
        site_checks(config)
    except OrbitError as exc:  # a site check that is not installed
        raise InvalidInput(f"{source}: {str(exc).removeprefix('scheduler config: ')}") from None
    except Exception as exc:  # one that is, but fails to load: its own bug, said in one line
        raise InvalidInput(f"{source}: a site check failed to load: {exc!r}") from None
    return data


def unified_diff(before: str, after: str, path: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), path, path
    )
    text = "".join(lines)
    return text if len(text) <= DIFF_CHARS else text[:DIFF_CHARS] + "\n... (cut)\n"


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    try:
        st = path.stat() if path is not None else None
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino) if st is not None else None


def _owner(path: Path) -> str:
    try:
        uid = path.stat().st_uid
        return pwd.getpwuid(uid).pw_name
    except (OSError, KeyError):
        return "unknown"


class LiveSchedConfig:
    """`path`: the file to watch (None: the defaults, always); `named`: it was named
    (ORBIT_SCHEDULER_CONFIG), so its absence is a mistake rather than the defaults."""

    def __init__(self, store: Store, path: Path | None, named: bool = False) -> None:
        self.store = store
        self.path = path
        self.named = named
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | str | None = "unread"
        self._live: Live | None = None
        self.error: ConfigError | None = None

    def config(self, quotas: tuple[Quota, ...]) -> SchedConfig:
        """The live config, with the store's quotas (unless the config gives its own)."""
        from orbit.scheduler.config import config_from_dict

        return config_from_dict(self.live().data, quotas=quotas)

    def live(self) -> Live:
        """The config in force, after a look at the file."""
        stamp = _stamp(self.path)
        with self._lock:
            if stamp != self._stamp or self._live is None:
                self._stamp = stamp
                self._look()
            assert self._live is not None
            return self._live

    # --- noticing an edit ----------------------------------------------------------------

    def _look(self) -> None:
        source = str(self.path) if self.path is not None else "(defaults)"
        text = None
        try:
            text = self._read()
            if self._live is not None and digest_of(text) == self._live.digest:
                self._valid_again()  # touched, or put back as it was
                return
            data = validate(text, source)
        except InvalidInput as exc:
            self._refused(str(exc), digest_of(text if text is not None else str(exc)))
            if self._live is None:
                self._live = self._last_good()
            return
        how = "removed" if not text and self.path is not None else "edited"
        owner = _owner(self.path) if self.path is not None and text else "orbit"
        self._adopt(text, digest_of(text), data, f"file:{owner}", how)

    def _read(self) -> str:
        if self.path is None:
            return ""
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self.named:
                raise InvalidInput(f"ORBIT_SCHEDULER_CONFIG: {self.path}: no such file") from None
            return ""  # $ORBIT_HOME/scheduler.yaml, not made (or removed): the defaults
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{self.path}: cannot be read ({exc})") from None

    def _refused(self, line: str, digest: str) -> None:
        """Say once per text that it was refused; the last good config stays live."""
        if self.error is not None and self.error.digest == digest:
            return
        self.error = ConfigError(line=line, digest=digest, since=datetime.now(UTC))
        log.error("scheduler config refused, the last good one stays live: %s", line)

    def _valid_again(self) -> None:
        if self.error is not None:
            log.info("scheduler config valid again: %s", self._live.source if self._live else "")
            self.error = None

    def _last_good(self) -> Live:
        """What a process starts from when the file is invalid: the store's last good config,
        else the defaults."""
        stored = self.store.sched_config.get()
        if stored is not None:
            try:
                data = validate(stored.text, stored.source)
            except InvalidInput:
                pass  # a site check uninstalled since: the defaults, rather than nothing
            else:
                source = f"{stored.source} (the last good config, kept in the store)"
                return Live(stored.text, stored.digest, data, source, stored.set_by, stored.set_at)
        now = datetime.now(UTC)
        return Live("", digest_of(""), {}, "no config file yet", "orbit", now)

    def _adopt(self, text: str, digest: str, data: dict[str, Any], actor: str, how: str) -> None:
        """Make `text` live and keep it in the store, audited once (by whichever process
        records it first) unless the store already has it."""
        source = str(self.path) if self.path is not None else "(defaults)"
        stored = self.store.sched_config.get()
        if (stored is None and text) or (stored is not None and stored.digest != digest):
            before = stored.text if stored is not None else ""
            self.store.sched_config.replace(
                text,
                digest,
                source,
                actor,
                was=stored.digest if stored is not None else None,
                how=how,
                diff=unified_diff(before, text, source),
            )
            stored = self.store.sched_config.get()
        if self._live is not None:
            log.info("scheduler config %s: %s (%s)", how, source, digest[:12])
        if stored is not None and stored.digest == digest:
            self._live = Live(text, digest, data, source, stored.set_by, stored.set_at)
        else:
            self._live = Live(text, digest, data, source, "orbit", datetime.now(UTC))
        self._valid_again()

    # --- `orbit sched config set` ----------------------------------------------------------

    def set_text(self, text: str, actor: str) -> Live:
        """Validate `text` and make it the config: written to the file (in one rename) and
        the store, audited with `actor` and the diff. InvalidInput, nothing written, if it
        is not a valid config."""
        if self.path is None:
            raise Refused("this control plane has no scheduler config file to write")
        data = validate(text, "scheduler config")
        digest = digest_of(text)
        with self._lock:
            stored = self.store.sched_config.get()
            if stored is not None and stored.digest == digest and self._file_holds(digest):
                return self._live or self._last_good()
            tmp = self._written_aside(text)
            try:
                before = stored.text if stored is not None else self._current_text()
                self.store.sched_config.replace(
                    text,
                    digest,
                    str(self.path),
                    actor,
                    was=stored.digest if stored is not None else None,
                    how="set",
                    diff=unified_diff(before, text, str(self.path)),
                )
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)
            self._stamp = _stamp(self.path)
            now = self.store.sched_config.get()
            set_by, set_at = (now.set_by, now.set_at) if now else (actor, datetime.now(UTC))
            self._live = Live(text, digest, data, str(self.path), set_by, set_at)
            self.error = None
            return self._live

    def _file_holds(self, digest: str) -> bool:
        try:
            return digest_of(self._current_text()) == digest
        except InvalidInput:
            return False

    def _current_text(self) -> str:
        try:
            return self._read()
        except InvalidInput:
            return ""

    def _written_aside(self, text: str) -> Path:
        """`text` in a file beside the config (same folder, so the rename is atomic)."""
        assert self.path is not None
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{self.path.name}.{os.getpid()}.{threading.get_ident()}"
            with tmp.open("w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            raise Refused(f"{self.path}: cannot be written ({exc.strerror or exc})") from None
        if self.path.exists():
            os.chmod(tmp, self.path.stat().st_mode & 0o7777)
        return tmp


def view_of(watch: LiveSchedConfig, quotas: tuple[Quota, ...]) -> SchedConfigView:
    """What `orbit sched config show` prints: the live config, and a refused newer one."""
    from orbit.core.control.views import SchedConfigView
    from orbit.scheduler.config import config_from_dict, config_to_dict

    live = watch.live()
    error = watch.error
    return SchedConfigView(
        text=live.text,
        digest=live.digest,
        source=live.source,
        path=str(watch.path) if watch.path is not None else None,
        set_by=live.set_by,
        set_at=live.set_at,
        config=config_to_dict(config_from_dict(live.data, quotas=quotas)),
        error=error.line if error is not None else None,
        error_since=error.since if error is not None else None,
    )

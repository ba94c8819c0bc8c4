"""Where ORBIT keeps its state: $ORBIT_HOME (default ~/.orbit) and the store's URL; or, in
server mode, which `orbit server` to talk to and the token to show it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from orbit.model.errors import InvalidInput

# Agent nodes by default: an agent heartbeats every HEARTBEAT_S; a node silent for
# OFFLINE_AFTER_S is offline (it gets no work), and its attempts are lost LOST_GRACE_S later, so
# that a dead node's work is requeued within 60 s of its last word.
HEARTBEAT_S = 5.0
OFFLINE_AFTER_S = 30.0
LOST_GRACE_S = 15.0
# A node cut off from the server that long (the lost timeout) stops its attempts itself
# (fencing, as Nomad's stop_after_client_disconnect), each with at most FENCE_STOP_S of its
# grace (a container's kill comes FENCE_KILL_MARGIN_S later); the retry of a lost attempt
# waits that long past the loss plus a heartbeat (the node's last word can reach it a
# heartbeat after the server's), so the two never overlap.
FENCE_STOP_S = 10.0
# a container's stop takes up to this much more before its wrapper kills it (docker_launch)
FENCE_KILL_MARGIN_S = 15.0


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    ssh_config: Path | None = None  # ORBIT_SSH_CONFIG: an ssh config file instead of ~/.ssh/config
    ssh_timeout_s: float = 15.0  # ORBIT_SSH_TIMEOUT: to connect, and silence that means a drop
    server: str | None = None  # ORBIT_SERVER (or `orbit login`): talk to this orbit server
    token: str | None = None  # ORBIT_TOKEN (or `orbit login`): the token to show it
    # agent nodes (ORBIT_NODE_HEARTBEAT_S, ORBIT_NODE_OFFLINE_S, ORBIT_NODE_LOST_GRACE_S): how
    # often agents heartbeat, how long a silent node stays online, and how much longer until
    # its attempts are lost and retried elsewhere
    node_heartbeat_s: float = HEARTBEAT_S
    node_offline_s: float = OFFLINE_AFTER_S
    node_lost_grace_s: float = LOST_GRACE_S
    node_fence: bool = True  # ORBIT_NODE_FENCE=0: a node cut off lets its attempts run on
    login_file: Path | None = None  # `orbit login`'s file (login_path); None: in `home`
    # PostgreSQL connections this process holds at most (the server's database_pool_size);
    # None: as many as its threads ask for at once (the CLI, a few)
    database_pool_size: int | None = None

    @property
    def fence_after_s(self) -> float | None:
        """How long a node may hear nothing from the server before it stops its attempts."""
        return self.node_offline_s + self.node_lost_grace_s if self.node_fence else None

    @property
    def lost_retry_floor_s(self) -> float:
        """The least wait of a lost attempt's automatic retry: its fenced node's stop first."""
        if not self.node_fence:
            return 0.0
        return self.node_heartbeat_s + FENCE_STOP_S + FENCE_KILL_MARGIN_S + 2.0

    @property
    def credentials_file(self) -> Path:
        """Where `orbit login` keeps the server's URL and its token (mode 0600)."""
        return self.login_file or self.home / "credentials.json"

    @property
    def bundles_dir(self) -> Path:
        """The content-addressed cache of frozen bundles, one folder per digest."""
        return self.home / "bundles"

    @property
    def work_dir(self) -> Path:
        """Where local attempts execute, one extracted bundle per attempt."""
        return self.home / "work"

    @property
    def artifacts_dir(self) -> Path:
        """The control plane's copy of agent-pool attempts' files, one folder per attempt."""
        return self.home / "artifacts"

    @property
    def templates_dir(self) -> Path:
        return self.home / "templates"

    @property
    def audit_key_file(self) -> Path:
        """ORBIT_AUDIT_KEY_FILE, else $ORBIT_HOME/audit-key: the key of the audit chain
        (orbit.model.audit_key), made there on first use."""
        named = os.environ.get("ORBIT_AUDIT_KEY_FILE")
        return Path(named).expanduser() if named else self.home / "audit-key"

    @property
    def secret_keys_file(self) -> Path:
        """ORBIT_SECRET_KEYS_FILE, else $ORBIT_HOME/secret-keys: the keys that seal secrets'
        values (orbit.model.secret_keys), made there on first use; ORBIT_SECRET_KEYS, when
        set, holds the key set itself instead."""
        named = os.environ.get("ORBIT_SECRET_KEYS_FILE")
        return Path(named).expanduser() if named else self.home / "secret-keys"

    @property
    def scheduler_config(self) -> Path:
        """ORBIT_SCHEDULER_CONFIG, else $ORBIT_HOME/scheduler.yaml: the scheduler's tiers,
        weights and limits (orbit.scheduler.config), watched for edits; while the default
        file does not exist, the defaults."""
        named = os.environ.get("ORBIT_SCHEDULER_CONFIG")
        return Path(named).expanduser() if named else self.home / "scheduler.yaml"

    @property
    def scheduler_config_named(self) -> bool:
        """Whether ORBIT_SCHEDULER_CONFIG names the file (then it must exist)."""
        return bool(os.environ.get("ORBIT_SCHEDULER_CONFIG"))

    @classmethod
    def from_env(cls) -> Settings:
        home = orbit_home()
        url = os.environ.get("ORBIT_DATABASE_URL") or f"sqlite:///{home / 'orbit.db'}"
        ssh_config = os.environ.get("ORBIT_SSH_CONFIG")
        timeout = os.environ.get("ORBIT_SSH_TIMEOUT")
        try:
            ssh_timeout = float(timeout) if timeout else 15.0
        except ValueError:
            raise InvalidInput(f"ORBIT_SSH_TIMEOUT: expected seconds, got {timeout!r}") from None
        server = os.environ.get("ORBIT_SERVER") or None
        token = os.environ.get("ORBIT_TOKEN") or None
        login = login_path(home)
        saved = _saved_login(login)
        if server is None and saved.get("server"):
            server = saved["server"]
        if token is None and server is not None and saved.get("server") == server:
            token = saved.get("token")
        return cls(
            node_heartbeat_s=_seconds("ORBIT_NODE_HEARTBEAT_S", HEARTBEAT_S),
            node_offline_s=_seconds("ORBIT_NODE_OFFLINE_S", OFFLINE_AFTER_S),
            node_lost_grace_s=_seconds("ORBIT_NODE_LOST_GRACE_S", LOST_GRACE_S),
            node_fence=os.environ.get("ORBIT_NODE_FENCE", "1") not in ("0", "false", "no", "off"),
            home=home.absolute(),
            database_url=url,
            ssh_config=Path(ssh_config).expanduser() if ssh_config else None,
            ssh_timeout_s=ssh_timeout,
            server=server.rstrip("/") if server else None,
            token=token,
            login_file=login,
        )


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"{name}: expected seconds, got {text!r}") from None
    if not value > 0:
        raise InvalidInput(f"{name}: expected seconds above 0, got {text!r}")
    return value


def orbit_home() -> Path:
    """$ORBIT_HOME, default ~/.orbit."""
    return Path(os.environ.get("ORBIT_HOME") or Path.home() / ".orbit").expanduser()


def login_path(home: Path) -> Path:
    """Where `orbit login` keeps the server and its token: a user's configuration, so under
    $XDG_CONFIG_HOME/orbit (default ~/.config/orbit), as other tools keep theirs; in
    $ORBIT_HOME where ORBIT_HOME is set (a home of its own, a test's) or where ~/.orbit holds
    one already (saved before: still read, and written there, so nothing is lost)."""
    kept = home / "credentials.json"
    if os.environ.get("ORBIT_HOME") or kept.exists():
        return kept
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "orbit" / "credentials.json"


def _saved_login(path: Path) -> dict[str, str]:
    """What `orbit login` saved: {"server": URL, "token": T}, or nothing."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InvalidInput(
            f"{path}: not the file `orbit login` writes ({exc}); remove it and log in again"
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: not the file `orbit login` writes; remove it, log in again")
    return {k: v for k, v in data.items() if isinstance(v, str)}


def save_login(path: Path, server: str, token: str) -> None:
    """Write the login for `server`, readable by its owner only (written 0600 from the start,
    never world-readable for a moment), replacing the file in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"server": server.rstrip("/"), "token": token}, out)
    os.replace(tmp, path)

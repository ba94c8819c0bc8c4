"""Real OpenSSH servers for the SSH backend's tests.

`sshd_factory` starts /usr/sbin/sshd processes on this machine, each with its own host key,
authorized_keys and private directories, and writes ONE ssh client config (`ssh -F config`)
plus ONE known_hosts file per test, both under tmp_path, with a `Host <alias>` block per
server. A server is either on 127.0.0.1 (a free port) or, with `netns=True`, alone in a
network namespace behind a veth pair (10.213.N.2, port 22) whose link can be cut and restored
to play a host that drops off the network.

Every session gets HOME=<server>/home (an empty private directory) through `SetEnv`, so the
login shell (root's bash) reads no ~/.bashrc: the remote environment does not depend on this
machine's dotfiles, and `path=` really is the whole PATH of remote commands (root's .bashrc
here prepends pyenv shims, which would hand out python3 even to a "python-less" host).

Teardown, also when the test fails: kills sshd, everything started through it (its process
tree, anything whose environment carries its SSH_CONNECTION, whose cwd or command line is
under its private directory, and for netns servers everything inside the namespace), the ssh
clients (ControlMaster included) whose command line names a path under tmp_path, then removes
the veth, the route and the namespace.

sshd missing or not root: skipped, or failed where ORBIT_REQUIRE_SSHD=1 (CI). Network
namespaces not permitted: skipped, or failed where ORBIT_REQUIRE_NETNS=1.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import secrets
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
# Shared by all pytest processes on the machine: which namespaces exist and who owns them.
NETNS_STATE_DIR = Path("/run/orbit-test-netns")
NETNS_PREFIX = "orbt-"
NETNS_SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")
# Metric of the per-server `unreachable` route that keeps packets for a cut link from ever
# following the default route off the machine (see _Netns.create).
GUARD_METRIC = 4242
STOP_GRACE_S = 2.0
START_TIMEOUT_S = 15.0

CLIENT_DEFAULTS = """\
# Written by tests/sshd.py. ssh takes the FIRST value it finds for an option, so the
# `Host *` block only sets options that no `Host <alias>` block below sets.
Host *
    ConnectTimeout 3
    ServerAliveInterval 1
    ServerAliveCountMax 3
    BatchMode yes
    StrictHostKeyChecking yes
    GlobalKnownHostsFile /dev/null
    UpdateHostKeys no
"""

# What a bare box without Python still has; `make_tool_dir` links the ones found here.
DEFAULT_TOOLS = (
    "sh", "bash", "env", "cat", "echo", "printf", "test", "[", "true", "false", "ls", "mkdir",
    "rmdir", "rm", "mv", "cp", "ln", "chmod", "touch", "stat", "readlink", "realpath", "dirname",
    "basename", "head", "tail", "wc", "sort", "tr", "cut", "sed", "grep", "awk", "find",
    "xargs", "tar", "gzip", "sha256sum", "df", "du", "uname", "hostname", "id", "whoami",
    "nproc", "date", "sleep", "kill", "ps", "nohup", "setsid", "timeout", "flock", "mktemp",
    "rsync",
)  # fmt: skip
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# ---------------------------------------------------------------------------------------------
# small helpers


def _skip_or_fail(reason: str, require_env: str) -> NoReturn:
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{reason} ({require_env}=1)")
    pytest.skip(reason)


def _run(argv: Sequence[str], *, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def _must(argv: Sequence[str], *, timeout: float = 15.0) -> str:
    res = _run(argv, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def _keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair without passphrase at path(.pub); returns 'ssh-ed25519 AAAA...'."""
    _must(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    kind, blob = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _mentions(args: Iterable[str], root: str) -> bool:
    """Whether any argument is, or contains a path under, root (not merely a longer sibling)."""
    return any(a == root or (root + "/") in a for a in args)


def _protected_pids() -> set[int]:
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


def _dead(p: psutil.Process) -> bool:
    """Gone, or a zombie: this machine's init reaps orphans only about once a second."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _wait_dead(procs: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Waits until all are dead; returns those still alive at the timeout."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if not _dead(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return alive


def _kill_all(procs: Iterable[psutil.Process], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL what is left."""
    protected = _protected_pids()
    victims = [p for p in {p.pid: p for p in procs}.values() if p.pid not in protected]
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    alive = _wait_dead(victims, grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait_dead(alive, grace)


def _scan(
    *, roots: Sequence[str], ssh_connection_suffix: str | None = None, names: set[str] | None = None
) -> list[psutil.Process]:
    """Processes whose cwd or command line is under one of `roots` (restricted to `names` when
    given), or whose environment has SSH_CONNECTION ending in `ssh_connection_suffix`."""
    found: list[psutil.Process] = []
    protected = _protected_pids()
    for p in psutil.process_iter(["name", "cmdline", "cwd"]):
        if p.pid in protected or _dead(p):
            continue
        try:
            if names is not None and p.info["name"] not in names:
                continue
            cmdline: list[str] = p.info["cmdline"] or []
            cwd: str = p.info["cwd"] or ""
            if any(_under(cwd, r) or _mentions(cmdline, r) for r in roots):
                found.append(p)
            elif ssh_connection_suffix is not None:
                conn = p.environ().get("SSH_CONNECTION", "")
                if conn.endswith(ssh_connection_suffix):
                    found.append(p)
        except psutil.Error:
            continue
    return found


def make_tool_dir(
    dest: Path, tools: Iterable[str] = DEFAULT_TOOLS, *, search_path: str = SYSTEM_PATH
) -> str:
    """Fill `dest` with symlinks to the system's `tools` (never python*); returns it as a PATH.

    For `sshd_factory(path=...)`: a host whose shell finds these tools and nothing else.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for name in tools:
        if name.startswith("python"):
            continue
        found = shutil.which(name, path=search_path)
        if found and not (dest / name).exists():
            (dest / name).symlink_to(os.path.realpath(found))
    return str(dest)


# ---------------------------------------------------------------------------------------------
# network namespaces


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args])


def _ip_must(*args: str) -> str:
    return _must(["ip", *args])


def _ip_json(*args: str) -> list[dict[str, object]]:
    out = _ip_must("-j", *args).strip()
    data = json.loads(out) if out else []
    return data if isinstance(data, list) else []


def _owner_alive(pid: int, start: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - start) < 1.0
    except psutil.Error:
        return False


@dataclass
class _Netns:
    """A namespace `name` joined to the root namespace by veth `root_dev` <-> `ns_dev`."""

    name: str
    root_dev: str
    ns_dev: str
    subnet: ipaddress.IPv4Network

    @property
    def root_addr(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def ns_addr(self) -> str:
        return str(self.subnet.network_address + 2)

    @property
    def state_file(self) -> Path:
        return NETNS_STATE_DIR / f"{self.name}.json"

    @classmethod
    def create(cls) -> _Netns:
        """Allocates and builds one; raises _NetnsUnavailable where the kernel says no."""
        if os.geteuid() != 0:
            raise _NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise _NetnsUnavailable("`ip` not installed: apt-get install iproute2")
        NETNS_STATE_DIR.mkdir(parents=True, exist_ok=True)
        with open(NETNS_STATE_DIR / ".lock", "a") as lock:
            # One allocator at a time on this machine (other pytest processes run too).
            fcntl.flock(lock, fcntl.LOCK_EX)
            _collect_stale_netns()
            tag = secrets.token_hex(3)
            ns = cls(
                name=f"{NETNS_PREFIX}{tag}",
                root_dev=f"orbt{tag}r",
                ns_dev=f"orbt{tag}n",
                subnet=_free_subnet(),
            )
            state = {
                "name": ns.name,
                "root_dev": ns.root_dev,
                "ns_dev": ns.ns_dev,
                "subnet": str(ns.subnet),
                "owner_pid": os.getpid(),
                "owner_start": psutil.Process().create_time(),
            }
            ns.state_file.write_text(json.dumps(state))
            try:
                ns._build()
            except BaseException:
                ns.destroy()
                raise
            return ns

    def _build(self) -> None:
        res = _ip("netns", "add", self.name)
        if res.returncode != 0:
            raise _NetnsUnavailable(f"`ip netns add` failed: {res.stderr.strip()}")
        res = _ip(
            "link",
            "add",
            self.root_dev,
            "type",
            "veth",
            "peer",
            "name",
            self.ns_dev,
            "netns",
            self.name,
        )
        if res.returncode != 0:
            raise _NetnsUnavailable(f"cannot create a veth pair: {res.stderr.strip()}")
        net, prefix = str(self.subnet), self.subnet.prefixlen
        # If the connected route ever goes (root end taken down, or a sysctl that ignores
        # routes over links without carrier), packets for the subnet must fail here rather
        # than follow the default route off this machine.
        _ip_must("route", "add", "unreachable", net, "metric", str(GUARD_METRIC))
        _ip_must("addr", "add", f"{self.root_addr}/{prefix}", "dev", self.root_dev)
        _ip_must("link", "set", self.root_dev, "up")
        _ip_must("-n", self.name, "addr", "add", f"{self.ns_addr}/{prefix}", "dev", self.ns_dev)
        _ip_must("-n", self.name, "link", "set", "lo", "up")
        _ip_must("-n", self.name, "link", "set", self.ns_dev, "up")
        self._pin_neighbour()

    def _pin_neighbour(self) -> None:
        # A permanent neighbour entry: with the link cut, packets are silently dropped (the
        # connection stalls) instead of failing ARP after ~3 s with "No route to host".
        # (Taking the root end administratively down would flush it: set_link pins it again.)
        mac = str(_ip_json("-n", self.name, "link", "show", "dev", self.ns_dev)[0]["address"])
        dev = self.root_dev
        _ip_must("neigh", "replace", self.ns_addr, "lladdr", mac, "dev", dev, "nud", "permanent")

    def _carrier(self) -> bool:
        flags = _ip_json("link", "show", "dev", self.root_dev)[0].get("flags", [])
        return isinstance(flags, list) and "LOWER_UP" in flags

    def set_link(self, up: bool) -> None:
        # The namespace's end goes down; the root end stays administratively up but loses its
        # carrier. Taking the root end itself down would delete its connected route, and the
        # kernel would then fail connections at once instead of letting them stall.
        if not up:
            self._pin_neighbour()
        _ip_must("-n", self.name, "link", "set", self.ns_dev, "up" if up else "down")
        deadline = time.monotonic() + 5
        while self._carrier() != up:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.root_dev}: carrier still {not up} after 5 s")
            time.sleep(0.02)

    def pids(self) -> list[int]:
        res = _ip("netns", "pids", self.name)
        return [int(x) for x in res.stdout.split() if x.isdigit()] if res.returncode == 0 else []

    def destroy(self) -> list[str]:
        """Kills what runs inside, deletes veth, guard route and namespace; returns errors."""
        errors: list[str] = []
        procs: list[psutil.Process] = []
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        _kill_all(procs)
        if left := self.pids():
            errors.append(f"netns {self.name}: processes survive SIGKILL: {left}")
        res = _ip("link", "del", self.root_dev)
        if res.returncode != 0 and "Cannot find device" not in res.stderr:
            errors.append(f"ip link del {self.root_dev}: {res.stderr.strip()}")
        res = _ip("route", "del", "unreachable", str(self.subnet), "metric", str(GUARD_METRIC))
        if res.returncode != 0 and "No such process" not in res.stderr:
            errors.append(f"ip route del unreachable {self.subnet}: {res.stderr.strip()}")
        res = _ip("netns", "del", self.name)
        if res.returncode != 0 and "No such file" not in res.stderr:
            errors.append(f"ip netns del {self.name}: {res.stderr.strip()}")
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        return errors


class _NetnsUnavailable(Exception):
    pass


def _collect_stale_netns() -> None:
    """Removes namespaces left by pytest processes that died without their teardown."""
    for state_file in NETNS_STATE_DIR.glob(f"{NETNS_PREFIX}*.json"):
        try:
            state = json.loads(state_file.read_text())
            if _owner_alive(int(state["owner_pid"]), float(state["owner_start"])):
                continue
            stale = _Netns(
                name=str(state["name"]),
                root_dev=str(state["root_dev"]),
                ns_dev=str(state["ns_dev"]),
                subnet=ipaddress.IPv4Network(state["subnet"]),
            )
        except (OSError, ValueError, KeyError):
            continue
        stale.destroy()


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.N.0/30 that no address, route or namespace on this machine uses (under lock)."""
    taken: list[ipaddress.IPv4Network] = []
    for entry in _ip_json("-4", "addr", "show"):
        infos = entry.get("addr_info", [])
        for info in infos if isinstance(infos, list) else []:
            taken.append(
                ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
            )
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = str(route.get("dst", ""))
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.IPv4Network(dst, strict=False))
    for state_file in NETNS_STATE_DIR.glob(f"{NETNS_PREFIX}*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            taken.append(ipaddress.IPv4Network(json.loads(state_file.read_text())["subnet"]))
    candidates = list(range(1, 255))
    random.shuffle(candidates)
    for n in candidates:
        subnet = ipaddress.IPv4Network(f"10.213.{n}.0/30")
        if not any(subnet.overlaps(t) and t.prefixlen > 0 for t in taken):
            return subnet
    raise RuntimeError(f"no free /30 left in {NETNS_SUPERNET}")


# ---------------------------------------------------------------------------------------------
# servers


def _host_pattern(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def _host_block(
    alias: str, hostname: str, port: int, user: str, identity: Path, known_hosts: Path
) -> str:
    return (
        f"\nHost {alias}\n"
        f"    HostName {hostname}\n"
        f"    Port {port}\n"
        f"    User {user}\n"
        f"    IdentityFile {identity}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known_hosts}\n"
    )


@dataclass
class SshServer:
    """One running sshd; reach it with `ssh -F <config> <alias>`."""

    alias: str
    hostname: str
    port: int
    user: str
    identity: Path
    config: Path
    known_hosts: Path
    host_key_pub: str
    netns: str | None
    work_root: Path
    home: Path
    base: Path
    log: Path
    wrong_identity: Path
    path: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # more SetEnv, e.g. DOCKER_HOST
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _ns: _Netns | None = field(default=None, repr=False)

    # -- client side --------------------------------------------------------------------------

    def ssh_argv(self, *remote: str, config: Path | None = None) -> list[str]:
        """`ssh -F <config> <alias> [remote...]`."""
        return ["ssh", "-F", str(config or self.config), self.alias, *remote]

    def run(
        self, command: str, *, config: Path | None = None, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Runs `command` on the server through ssh (never raises on a non-zero exit)."""
        return _run(self.ssh_argv(command, config=config), timeout=timeout)

    @property
    def rsh(self) -> str:
        """For `rsync -e`: the ssh command with this test's client config."""
        return shlex.join(["ssh", "-F", str(self.config)])

    def client_config(
        self, dest: Path, *, identity: Path | None = None, known_hosts: Path | None = None
    ) -> Path:
        """Writes a config at `dest` for this server alone, optionally with another key or
        known_hosts file; returns dest."""
        block = _host_block(
            self.alias,
            self.hostname,
            self.port,
            self.user,
            identity or self.identity,
            known_hosts or self.known_hosts,
        )
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(CLIENT_DEFAULTS + block)
        return dest

    def unknown_host_key_config(self) -> Path:
        """A config whose (empty) known_hosts does not know this server: ssh fails with
        'Host key verification failed.' (exit 255) unless told StrictHostKeyChecking=no or
        accept-new on its command line."""
        d = self.base / "client-unknown-host"
        d.mkdir(exist_ok=True)
        (d / "known_hosts").touch()
        return self.client_config(d / "config", known_hosts=d / "known_hosts")

    def wrong_identity_config(self) -> Path:
        """A config that offers `wrong_identity`, a key the server does not accept."""
        return self.client_config(
            self.base / "client-wrong-key" / "config", identity=self.wrong_identity
        )

    def log_text(self) -> str:
        """sshd's log so far (all starts of this server)."""
        return self._log_bytes().decode(errors="replace").replace("\r\n", "\n")

    def _log_bytes(self) -> bytes:
        # sshd -e ends its lines with \r\n
        try:
            return self.log.read_bytes()
        except OSError:
            return b""

    # -- network ------------------------------------------------------------------------------

    def link_down(self) -> None:
        """Cuts the server's link: packets are dropped silently, so new connections time out
        (ConnectTimeout) and live ones stall until ServerAlive gives up. netns servers only."""
        if self._ns is None:
            raise RuntimeError(f"{self.alias}: link_down needs a server made with netns=True")
        self._ns.set_link(False)

    def link_up(self) -> None:
        """Restores the link and waits until the server accepts TCP connections again."""
        if self._ns is None:
            raise RuntimeError(f"{self.alias}: link_up needs a server made with netns=True")
        self._ns.set_link(True)
        self._wait_port(10.0)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """(Re)starts sshd on the same address, port and host key; waits until ssh works."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._write_sshd_config()
        argv = [str(SSHD), "-D", "-e", "-f", str(self.base / "sshd_config"), "-o", "StrictModes=no"]
        if self._ns is not None:
            argv = ["ip", "netns", "exec", self._ns.name, *argv]
        if shutil.which("setpriv"):
            # sshd's listener follows pytest if pytest is killed before its teardown.
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
        with self.log.open("ab") as log:
            log_start = log.tell()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Its own word first: whoever else may hold the port would accept connections too.
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"Server listening on" not in self._log_bytes()[log_start:]:
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd {self.alias} does not say it listens\n{self._log_tail()}")
            time.sleep(0.02)
        self._wait_port(START_TIMEOUT_S)
        res = self.run("true", timeout=START_TIMEOUT_S)
        if res.returncode != 0:
            raise RuntimeError(
                f"sshd {self.alias} listens but `ssh true` fails ({res.returncode}): "
                f"{res.stderr.strip()}\n{self._log_tail()}"
            )

    def stop(self) -> list[str]:
        """Stops sshd and kills everything started through it; the server can start() again.
        Returns what could not be cleaned up (empty when all went)."""
        procs: list[psutil.Process] = []
        if self._proc is not None:
            with contextlib.suppress(psutil.Error):
                sshd = psutil.Process(self._proc.pid)
                procs += [sshd, *sshd.children(recursive=True)]
        if self._ns is not None:
            for pid in self._ns.pids():
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        procs += _scan(roots=[str(self.base)], ssh_connection_suffix=self._conn_suffix)
        _kill_all(procs)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=STOP_GRACE_S)
        errors = []
        if left := _scan(roots=[str(self.base)], ssh_connection_suffix=self._conn_suffix):
            errors.append(f"{self.alias}: processes survive SIGKILL: {[p.pid for p in left]}")
        return errors

    def destroy(self) -> list[str]:
        errors = self.stop()
        if self._ns is not None:
            errors += self._ns.destroy()
        return errors

    # -- internals ----------------------------------------------------------------------------

    @property
    def _conn_suffix(self) -> str:
        # SSH_CONNECTION="client_ip client_port server_ip server_port", inherited by every
        # process a session starts, daemonized ones included.
        return f" {self.hostname} {self.port}"

    def _write_sshd_config(self) -> None:
        setenv = [f'"HOME={self.home}"'] + ([f'"PATH={self.path}"'] if self.path else [])
        setenv += [f'"{k}={v}"' for k, v in sorted(self.env.items())]
        (self.base / "sshd_config").write_text(
            f"ListenAddress {self.hostname}:{self.port}\n"
            f"HostKey {self.base / 'ssh_host_ed25519_key'}\n"
            f"PidFile {self.base / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.base / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "MaxSessions 50\n"
            "MaxStartups 100\n"
            "LogLevel VERBOSE\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "PermitUserRC no\n"
            "X11Forwarding no\n"
            "AllowTcpForwarding yes\n"
            "Subsystem sftp internal-sftp\n"
            # Applied after sshd's own HOME/PATH, before the login shell starts.
            f"SetEnv {' '.join(setenv)}\n"
        )

    def _log_tail(self) -> str:
        return f"--- sshd log ({self.log}):\n{self.log_text()[-3000:]}"

    def _check_alive(self) -> None:
        if self._proc is not None and (rc := self._proc.poll()) is not None:
            raise _SshdExited(f"sshd {self.alias} exited ({rc})\n{self._log_tail()}")

    def _wait_port(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not _accepts(self.hostname, self.port):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"sshd {self.alias} does not accept on {self.hostname}:{self.port} after "
                    f"{timeout:.0f} s\n{self._log_tail()}"
                )
            time.sleep(0.02)


class _SshdExited(Exception):
    pass


class SshdFactory:
    """`sshd_factory(netns=False, path=None, alias=None)` -> a running SshServer.

    All servers of a test share `config`, `known_hosts`, `identity` (the client key) and
    `wrong_identity` (a key no server accepts).
    """

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.client_dir = tmp_path / "ssh-client"
        self.client_dir.mkdir(mode=0o700)
        self.config = self.client_dir / "config"
        self.known_hosts = self.client_dir / "known_hosts"
        self.identity = self.client_dir / "id_ed25519"
        self.wrong_identity = self.client_dir / "wrong_ed25519"
        self.servers: list[SshServer] = []
        self.config.write_text(CLIENT_DEFAULTS)
        self.known_hosts.touch()
        self.identity_pub = _keygen(self.identity, "orbit-test-client")
        _keygen(self.wrong_identity, "orbit-test-wrong-key")

    def __call__(
        self,
        *,
        netns: bool = False,
        path: str | None = None,
        alias: str | None = None,
        env: dict[str, str] | None = None,
    ) -> SshServer:
        alias = alias or f"orbit-sshd-{len(self.servers)}"
        if any(s.alias == alias for s in self.servers):
            raise ValueError(f"alias {alias!r} already used in this test")
        base = self.tmp_path / "sshd" / alias
        base.mkdir(parents=True, mode=0o700)
        (base / "home").mkdir(mode=0o700)
        (base / "work").mkdir(mode=0o700)
        host_key_pub = _keygen(base / "ssh_host_ed25519_key", f"orbit-test-host-{alias}")
        (base / "authorized_keys").write_text(self.identity_pub + "\n")

        ns: _Netns | None = None
        if netns:
            try:
                ns = _Netns.create()
            except _NetnsUnavailable as exc:
                _skip_or_fail(f"network namespaces unavailable: {exc}", "ORBIT_REQUIRE_NETNS")
        server = SshServer(
            alias=alias,
            hostname=ns.ns_addr if ns else "127.0.0.1",
            port=22 if ns else _free_port(),
            user="root",
            identity=self.identity,
            config=self.config,
            known_hosts=self.known_hosts,
            host_key_pub=host_key_pub,
            netns=ns.name if ns else None,
            work_root=base / "work",
            home=base / "home",
            base=base,
            log=base / "sshd.log",
            wrong_identity=self.wrong_identity,
            path=path,
            env=dict(env or {}),
            _ns=ns,
        )
        # Registered before it starts, so teardown also cleans up a server that failed to.
        self.servers.append(server)
        with self.known_hosts.open("a") as f:
            f.write(f"{_host_pattern(server.hostname, server.port)} {host_key_pub}\n")
        with self.config.open("a") as f:
            f.write(
                _host_block(
                    alias,
                    server.hostname,
                    server.port,
                    server.user,
                    self.identity,
                    self.known_hosts,
                )
            )
        for attempt in range(5):
            try:
                server.start()
                break
            except _SshdExited as exc:
                # Lost the race for the port to another process: take another one.
                if ns is not None or "Address already in use" not in str(exc) or attempt == 4:
                    raise RuntimeError(str(exc)) from None
                self._change_port(server, _free_port())
        return server

    def _change_port(self, server: SshServer, port: int) -> None:
        old = _host_pattern(server.hostname, server.port)
        new = _host_pattern(server.hostname, port)
        self.known_hosts.write_text(self.known_hosts.read_text().replace(f"{old} ", f"{new} "))
        text = self.config.read_text()
        head, sep, tail = text.partition(f"\nHost {server.alias}\n")
        tail = tail.replace(f"    Port {server.port}\n", f"    Port {port}\n", 1)
        self.config.write_text(head + sep + tail)
        server.port = port

    def close(self) -> None:
        """Tears everything down; raises at the end if something could not be cleaned up."""
        errors: list[str] = []
        # ssh clients of this test first (ControlMasters, forgotten background ssh or rsync):
        # they name the config, an identity or a ControlPath under tmp_path.
        clients = _scan(roots=[str(self.tmp_path)], names={"ssh", "rsync", "scp", "sftp"})
        _kill_all(clients)
        for server in reversed(self.servers):
            try:
                errors += server.destroy()
            except Exception as exc:  # keep going: the other servers must go too
                errors.append(f"{server.alias}: teardown failed: {exc!r}")
        if errors:
            raise RuntimeError("sshd teardown incomplete:\n" + "\n".join(errors))


def _require_sshd() -> None:
    if not SSHD.exists():
        _skip_or_fail("sshd not installed: apt-get install openssh-server", "ORBIT_REQUIRE_SSHD")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            _skip_or_fail(
                f"{tool} not installed: apt-get install openssh-client", "ORBIT_REQUIRE_SSHD"
            )
    if os.geteuid() != 0:
        _skip_or_fail(
            "the sshd fixtures log in as root: run the tests as root", "ORBIT_REQUIRE_SSHD"
        )
    # sshd's privilege separation directory; Debian creates it only when the service starts.
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)


@pytest.fixture
def sshd_factory(tmp_path: Path) -> Iterator[SshdFactory]:
    """Makes real sshd servers for one test; see the module docstring."""
    _require_sshd()
    factory = SshdFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def sshd_server(sshd_factory: SshdFactory) -> SshServer:
    """One sshd on 127.0.0.1, alias "orbit-sshd-0"."""
    return sshd_factory()


__all__ = [
    "DEFAULT_TOOLS",
    "SshServer",
    "SshdFactory",
    "make_tool_dir",
    "sshd_factory",
    "sshd_server",
]

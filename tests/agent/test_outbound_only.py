"""An agent that nothing can reach: `orbit agent` alone in a network namespace behind a veth pair
(tests/sshd.py's _Netns), under an nftables ruleset that drops every inbound connection. The
real `orbit server` listens on the host's end of the veth. Pool runs complete on that agent,
it listens on no port, and a connection into the namespace is dropped the whole time. A cut of
the link shorter than the offline timeout loses no line of a run's log and changes nothing
else: the run goes on and succeeds with its one attempt.

Network namespaces not permitted (or nft missing): skipped, or failed where
ORBIT_REQUIRE_NETNS=1 (CI)."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orbit.model.config import Settings
from orbit.model.nodes import NodeState
from tests.agent.test_pool_runs import ended, run_of, submit
from tests.agents import AgentProc, control, wait_online
from tests.helpers import eventually, orbit
from tests.orbit_server import Server
from tests.sshd import _Netns, _NetnsUnavailable, _skip_or_fail

PROBE_PORT = 4242  # the throwaway listener's, inside the namespace
WALL = """
table inet orbit_wall {
    chain input {
        type filter hook input priority filter; policy drop;
        ct state established,related accept
        iif "lo" accept
        counter drop
    }
}
"""
# A black hole: nothing from the server arrives (priority before the wall's accept)
BLACKHOLE = """
table inet orbit_cut {{
    chain input {{
        type filter hook input priority filter - 10; policy accept;
        ip saddr {server} drop
    }}
}}
"""
LISTENER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""
TCP_STATES = {"01": "ESTABLISHED", "0A": "LISTEN"}


@dataclass
class Walled:
    """A namespace the agent runs in, and what the test does to its network."""

    ns: _Netns
    procs: list[subprocess.Popen[bytes]]

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns.name]

    def nft(self, ruleset: str) -> None:
        subprocess.run([*self.prefix, "nft", "-f", "-"], input=ruleset.encode(), check=True)

    def wall(self) -> None:
        """Drop every inbound connection; what the namespace opened itself still flows."""
        self.nft(WALL)

    def drops(self) -> int:
        out = _out([*self.prefix, "nft", "list", "chain", "inet", "orbit_wall", "input"])
        found = re.search(r"counter packets (\d+)", out)
        assert found, out
        return int(found.group(1))

    def cut(self, how: str) -> None:
        if how == "link":
            self.ns.set_link(False)  # the namespace's end down: the agent's sends fail
        else:
            self.nft(BLACKHOLE.format(server=self.ns.root_addr))  # silence, no error

    def restore(self, how: str) -> None:
        if how == "link":
            self.ns.set_link(True)
        else:
            subprocess.run(
                [*self.prefix, "nft", "delete", "table", "inet", "orbit_cut"], check=True
            )

    def listen(self, port: int) -> subprocess.Popen[bytes]:
        """A throwaway TCP listener inside the namespace."""
        proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-c", LISTENER, str(port)],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        return proc

    def listening(self) -> list[tuple[str, set[int]]]:
        """Every listening TCP socket and bound UDP socket in the namespace: (local, pids)."""
        found = []
        for line in _out([*self.prefix, "ss", "-Htulnp"]).splitlines():
            fields = line.split()
            found.append(
                (f"{fields[0]} {fields[4]}", {int(p) for p in re.findall(r"pid=(\d+)", line)})
            )
        return found


@pytest.fixture
def walled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Walled]:
    """A fresh namespace; everything in it killed, and it and its veth deleted, at the end."""
    for tool in ("ip", "nft", "ss"):
        if shutil.which(tool) is None:
            _skip_or_fail(f"`{tool}` not installed (iproute2, nftables)", "ORBIT_REQUIRE_NETNS")
    try:
        ns = _Netns.create()
    except _NetnsUnavailable as exc:
        _skip_or_fail(f"network namespaces unavailable: {exc}", "ORBIT_REQUIRE_NETNS")
    monkeypatch.setenv("ORBIT_NODE_HEARTBEAT_S", "1")
    walled = Walled(ns, [])
    try:
        probe = subprocess.run(
            [*walled.prefix, "nft", "list", "ruleset"], capture_output=True, text=True
        )
        if probe.returncode != 0:
            _skip_or_fail(f"nftables unusable here: {probe.stderr.strip()}", "ORBIT_REQUIRE_NETNS")
        yield walled
    finally:
        for proc in walled.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        errors = ns.destroy()  # kills the agent and its attempts too: they run in there
        if errors:
            raise RuntimeError("netns teardown incomplete:\n" + "\n".join(errors))


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _connect(host: str, port: int, timeout: float = 2.0) -> str:
    """'connected', 'timed out' (dropped on the way) or 'refused' (a RST came back)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            assert sock.recv(2) == b"hi"
            return "connected"
    except TimeoutError:
        return "timed out"
    except ConnectionRefusedError:
        return "refused"


def _sockets(pid: int) -> dict[int, tuple[str, str]]:
    """The TCP sockets of a process, by inode: (state, remote address), read from /proc (its
    /proc/PID/net is its namespace's)."""
    inodes = set()
    found: dict[int, tuple[str, str]] = {}
    try:  # a short-lived process (the task's `sleep`) may be gone by now: it had none
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
        tables = [Path(f"/proc/{pid}/net/{t}").read_text() for t in ("tcp", "tcp6")]
    except FileNotFoundError:
        return found
    for fd in fds:
        with contextlib.suppress(OSError):
            target = fd.readlink().as_posix()
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            inode = int(fields[9])
            if inode in inodes:
                found[inode] = (TCP_STATES.get(fields[3], fields[3]), _address(fields[2]))
    return found


def _address(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    if len(host) == 8:
        return f"{socket.inet_ntoa(bytes.fromhex(host)[::-1])}:{int(port, 16)}"
    return f"[{host}]:{int(port, 16)}"


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_an_agent_nothing_can_connect_to_runs_pool_runs(
    walled: Walled,
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    server = start_server(host=walled.ns.root_addr)
    listener = walled.listen(PROBE_PORT)
    # before the wall the namespace is reachable from the host; after it, not
    assert _connect(walled.ns.ns_addr, PROBE_PORT) == "connected"
    walled.wall()
    assert _connect(walled.ns.ns_addr, PROBE_PORT) == "timed out"
    assert walled.drops() >= 1
    agent = start_agent(server, "walled", prefix=walled.prefix, max_tasks=3)
    wait_online(server, "walled", timeout=60)
    flag = tmp_path / "go"
    held = submit(server, tmp_path, f"echo held; while [ ! -e {flag} ]; do sleep 0.1; done")
    quick = [submit(server, tmp_path, f"echo quick-{i}; echo done-{i}") for i in range(2)]
    eventually(lambda: run_of(server, held)["attempts"][-1]["state"] == "running", 60)

    # (b) while it runs attempts, the agent listens on no port: the only listening socket in
    # the namespace is the throwaway listener's; the agent's own sockets are connections out
    listening = walled.listening()
    assert listening == [(f"tcp 0.0.0.0:{PROBE_PORT}", {listener.pid})], listening
    # every process in there (the attempts' wrappers are detached from the agent), by /proc
    inside = [pid for pid in walled.ns.pids() if pid != listener.pid]
    assert agent.pid in inside and len(inside) > 1, inside
    states = {pid: _sockets(pid) for pid in inside}
    assert all(s != "LISTEN" for found in states.values() for s, _ in found.values()), states
    to_server = f"{walled.ns.root_addr}:{_port(server)}"
    assert ("ESTABLISHED", to_server) in states[agent.pid].values(), states

    # (c) and the wall is in force all along
    before = walled.drops()
    assert _connect(walled.ns.ns_addr, PROBE_PORT) == "timed out"
    assert walled.drops() > before

    flag.touch()
    env = server.env()
    for i, run_id in enumerate(quick):
        attempt = ended(server, run_id)["attempts"][-1]
        assert attempt["state"] == "succeeded", (attempt, agent.output()[-3000:])
        assert attempt["handle"]["target"] == "walled"
        assert orbit(env, "logs", run_id).stdout.split() == [f"quick-{i}", f"done-{i}"]
        assert orbit(env, "logs", run_id, "--tail", "1").stdout == f"done-{i}\n"  # pool copy
    assert ended(server, held)["attempts"][-1]["state"] == "succeeded"
    assert orbit(env, "logs", held).stdout.split() == ["held"]
    assert _connect(walled.ns.ns_addr, PROBE_PORT) == "timed out"


LINES = 100


@pytest.mark.parametrize("how", ["link", "blackhole"])
def test_a_cut_shorter_than_the_offline_timeout_loses_no_line(
    how: str,
    walled: Walled,
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    """`link`: the namespace's end of the veth goes down (the agent's sends fail at once);
    `blackhole`: nothing from the server reaches the namespace (the agent hears nothing)."""
    walled.wall()
    server = start_server(host=walled.ns.root_addr, env={"ORBIT_NODE_OFFLINE_S": "30"})
    agent = start_agent(server, "cut", prefix=walled.prefix)
    wait_online(server, "cut", timeout=60)
    command = f"for i in $(seq 1 {LINES}); do echo line-$i; sleep 0.1; done"
    run_id = submit(server, tmp_path, command)
    attempt_id = eventually(lambda: _running(server, run_id), 60)
    artifacts = Settings(home=server.home, database_url=server.database_url).artifacts_dir
    mirror = artifacts / attempt_id / "artifacts" / "training.log"
    local = agent.work_dir / "attempts" / attempt_id / "artifacts" / "training.log"
    eventually(lambda: _lines(mirror) >= 5, 30)
    assert _lines(local) < LINES - 40, "the run must still be printing when the link is cut"

    walled.cut(how)
    try:
        time.sleep(1.0)  # what was on its way has arrived
        frozen, printed = _size(mirror), _lines(local)
        time.sleep(2.0)
        assert _size(mirror) == frozen, "the cut let reports through"
        assert _lines(local) > printed, "the run went on printing"
    finally:
        walled.restore(how)

    run = ended(server, run_id, timeout=90)
    assert [a["state"] for a in run["attempts"]] == ["succeeded"], (
        run["attempts"],
        agent.output()[-3000:],
    )
    logs = orbit(server.env(), "logs", run_id).stdout
    assert logs.split() == [f"line-{i}" for i in range(1, LINES + 1)]
    assert mirror.read_bytes() == local.read_bytes()
    service = control(server)
    try:  # the node was never taken for gone
        assert service.get_node("cut").state is NodeState.ACTIVE
        events = [e.action for e in service.audit(run=run_id)]
    finally:
        service.close()
    assert events.count("attempt.placed") == 1, events


def _running(server: Server, run_id: str) -> str | None:
    attempt = run_of(server, run_id)["attempts"][-1]
    return str(attempt["id"]) if attempt["state"] == "running" else None


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

"""A run across several nodes (`num_nodes`, a gang) on an agent pool, end to end with a real
`orbit server` and real `orbit agent` processes: every rank is placed at once or none, each
node's task learns its rank and where the gang meets (ORBIT_NODE_RANK, ORBIT_NUM_NODES,
ORBIT_MASTER_ADDR, ORBIT_MASTER_PORT) and the ranks really meet there over TCP; one rank's
failure fails the run, naming the rank, and stops the others; a cancel stops every rank; a gang
larger than the pool could ever hold is refused at submit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agent.test_pool_runs import ended
from tests.agents import AgentProc, control, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

# rank 0 listens where the gang meets; every other rank connects there and says who it is;
# rank 0 prints what it heard. Each rank also appends what it was told to the ledger
MEET = r"""
import os, socket, sys, time
rank, size = int(os.environ["ORBIT_NODE_RANK"]), int(os.environ["ORBIT_NUM_NODES"])
addr, port = os.environ["ORBIT_MASTER_ADDR"], int(os.environ["ORBIT_MASTER_PORT"])
with open(sys.argv[1], "a") as ledger:
    ledger.write(f"{rank} {size} {addr} {port} {os.environ['ORBIT_NODE_NAME']}\n")
if rank == 0:
    server = socket.create_server((addr, port))
    heard = []
    for _ in range(size - 1):
        conn, _ = server.accept()
        heard.append(conn.recv(100).decode())
    print("rank 0 heard:", ", ".join(sorted(heard)), flush=True)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((addr, port), timeout=2) as conn:
                conn.sendall(f"rank {rank} from {os.environ['ORBIT_NODE_NAME']}".encode())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
"""


def submit(server: Server, folder: Path, command: Any, **overrides: Any) -> str:
    spec = write_spec(
        folder,
        name=f"spec-{time.monotonic_ns()}.yaml",
        template="pool",
        task={"command": command},
        overrides=overrides,
    )
    return str(orbit_json(server.env(), "submit", str(spec))["id"])


def pool(server: Server, start_agent: Callable[..., AgentProc], *names: str) -> None:
    for name in names:
        start_agent(server, name, max_tasks=1, extra=["--address", "127.0.0.1"])
    wait_online(server, *names)


def busy(server: Server) -> dict[str, int]:
    service = control(server)
    try:
        return {n.name: len(n.running) for n in service.list_nodes()}
    finally:
        service.close()


def test_a_gang_is_placed_on_as_many_nodes_and_its_ranks_meet(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    pool(orbit_server, start_agent, "g0", "g1", "g2")
    script = tmp_path / "meet.py"
    script.write_text(MEET, encoding="utf-8")
    ledger = tmp_path / "ledger"
    run_id = submit(orbit_server, tmp_path, ["python3", str(script), str(ledger)], num_nodes=3)
    run = ended(orbit_server, run_id, timeout=120)
    [attempt] = run["attempts"]  # one attempt for the run, whatever the nodes
    assert attempt["state"] == "succeeded", attempt
    lines = sorted(ledger.read_text().splitlines())
    ranks = [line.split() for line in lines]
    # each rank once, on its own node, all told the same size, address and port
    assert [r[0] for r in ranks] == ["0", "1", "2"], lines
    assert {r[4] for r in ranks} == {"g0", "g1", "g2"}, lines
    assert {(r[1], r[2], r[3]) for r in ranks} == {("3", "127.0.0.1", ranks[0][3])}, lines
    assert 20000 <= int(ranks[0][3]) < 32000
    rank0_node = next(r[4] for r in ranks if r[0] == "0")
    assert attempt["handle"]["target"] == rank0_node
    # where it ran, every node of it, rank 0 first (runs list, status, runs show)
    by_rank = "+".join(r[4] for r in ranks)
    assert orbit_json(orbit_server.env(), "runs", "show", run_id)["attempts"][0]["where"] == by_rank
    assert f"on nodes {by_rank}" in orbit(orbit_server.env(), "status", run_id).stdout
    assert [
        r["id"] for r in orbit_json(orbit_server.env(), "runs", "list", "--node", ranks[2][4])
    ] == [run_id]
    # and they met there: rank 0's log (the run's) says whom it heard
    log = orbit(orbit_server.env(), "logs", run_id).stdout
    others = sorted(f"rank {r[0]} from {r[4]}" for r in ranks if r[0] != "0")
    assert f"rank 0 heard: {', '.join(others)}" in log, log
    # every node's slot is free again
    eventually(lambda: busy(orbit_server) == {"g0": 0, "g1": 0, "g2": 0}, timeout=30)
    # collect brings each rank's artifacts back: rank 0's at the top, the others' under nodes/
    dest = tmp_path / "collected"
    orbit(orbit_server.env(), "collect", run_id, "--dest", str(dest))
    assert (dest / "nodes" / "1").is_dir() and (dest / "nodes" / "2").is_dir()


def test_one_rank_failing_fails_the_gang_and_stops_the_others(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    pool(orbit_server, start_agent, "f0", "f1")
    ledger = tmp_path / "ledger"
    command = (
        f'echo "start $ORBIT_NODE_RANK" >> {ledger}; '
        'if [ "$ORBIT_NODE_RANK" = 1 ]; then sleep 1; exit 3; fi; '
        f'sleep 90; echo "end $ORBIT_NODE_RANK" >> {ledger}'
    )
    run_id = submit(orbit_server, tmp_path, command, num_nodes=2)
    # well before rank 0's sleep is over
    run = ended(orbit_server, run_id, timeout=60)
    attempt = run["attempts"][-1]
    assert attempt["state"] == "failed", attempt
    assert attempt["exit_code"] == 3, attempt
    assert "rank 1 (node 'f" in (attempt["message"] or ""), attempt
    # rank 0 was stopped, not left to run: both nodes take work again, and it never ended
    eventually(lambda: busy(orbit_server) == {"f0": 0, "f1": 0}, timeout=30)
    lines = ledger.read_text().splitlines()
    assert sorted(lines) == ["start 0", "start 1"], lines


def test_a_cancelled_gang_stops_on_every_node(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agents = [start_agent(orbit_server, n, max_tasks=1) for n in ("c0", "c1")]
    wait_online(orbit_server, "c0", "c1")
    ledger = tmp_path / "ledger"
    command = f'echo "start $ORBIT_NODE_RANK" >> {ledger}; sleep 90; echo end >> {ledger}'
    run_id = submit(orbit_server, tmp_path, command, num_nodes=2)
    eventually(lambda: ledger.exists() and len(ledger.read_text().splitlines()) == 2, timeout=60)
    orbit(orbit_server.env(), "cancel", run_id)
    attempt = ended(orbit_server, run_id, timeout=60)["attempts"][-1]
    assert (attempt["state"], attempt["reason"]) == ("terminated", "cancelled"), attempt
    eventually(lambda: busy(orbit_server) == {"c0": 0, "c1": 0}, timeout=30)

    def wrappers_gone() -> bool:  # no task of the run is left on either node
        return all(not _running(a) for a in agents)

    eventually(wrappers_gone, timeout=30)
    assert "end" not in ledger.read_text()


def _running(agent: AgentProc) -> list[str]:
    """The attempts whose wrapper still runs on the agent's node."""
    alive = []
    for folder in (agent.work_dir / "attempts").glob("*/runtime/pid"):
        try:
            os.kill(int(folder.read_text().strip()), 0)
        except (OSError, ValueError):
            continue
        alive.append(folder.parent.parent.name)
    return alive


def test_a_gang_larger_than_the_pool_could_ever_hold_is_refused_at_submit(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    pool(orbit_server, start_agent, "r0", "r1")
    spec = write_spec(tmp_path, template="pool", overrides={"num_nodes": 3})
    proc = orbit(orbit_server.env(), "submit", str(spec), check=False)
    assert proc.returncode != 0
    assert "num_nodes: 3 nodes asked for at once, but only 2 registered node(s)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert orbit_json(orbit_server.env(), "runs", "list") == []  # nothing was queued

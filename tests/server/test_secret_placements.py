"""A run's secret on every placement, through a real `orbit server` on both stores: an agent
node (a real `orbit agent`), an SSH host (a real sshd on loopback) and a Slurm cluster (the
private test cluster). The task reads HF_TOKEN from a secret and prints it; while it runs no
process's command line on the machine holds the value, and the key set is rotated under it.
Afterwards `orbit logs`, the API, the audit, /metrics, the collected artifacts, every file
under the test's folders (the server's home and copies, the node's, the host's and the
cluster's work dirs) and a dump of the store hold `***`, never the value nor its base64. A
retry after the value changed gets the new value."""

from __future__ import annotations

import base64
import hashlib
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agents import AgentProc, wait_online
from tests.helpers import ORBIT, eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.server.test_secrets_api import every_row

VALUE = "hf_PlacedSecret_a1B2c3D4e5F6g7H8"
NEW = "hf_NewValue_z9Y8x7W6v5U4t3S2"


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def forms(value: str) -> list[bytes]:
    raw = value.encode()
    return [raw, base64.b64encode(raw), base64.b64encode(raw).rstrip(b"=")]


def assert_masked(where: str, data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    for value in (VALUE, NEW):
        assert not any(form in raw for form in forms(value)), f"{where} holds {value}"


def set_secret(server: Server, value: str) -> None:
    done = subprocess.run(
        [*ORBIT, "secrets", "set", "hf"], env=server.env(), input=value, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    assert value not in done.stdout + done.stderr


def place(
    kind: str, request: pytest.FixtureRequest, start_server: Callable[..., Server], tmp_path: Path
) -> tuple[Server, dict[str, Any], list[Path]]:
    """A server and what a spec needs to run on `kind`; the folders the run's files land in."""
    if kind == "agent":
        server = start_server()
        start_agent: Callable[..., AgentProc] = request.getfixturevalue("start_agent")
        start_agent(server, "gpu-a")
        wait_online(server, "gpu-a")
        return server, {"template": "pool"}, []
    if kind == "ssh":
        sshd = request.getfixturevalue("sshd_factory")
        box = sshd(alias="box")
        server = start_server(env={"ORBIT_SSH_CONFIG": str(sshd.config)})
        add = ["hosts", "add", "box", "--ssh", box.alias, "--work-dir", str(box.work_root)]
        orbit(server.env(), *add)
        overrides = {"target": "box", "resources": {"gpu_count": 0}}
        return server, {"template": "ssh", "overrides": overrides}, [box.work_root]
    slurm = request.getfixturevalue("slurm")
    server = start_server()
    work = tmp_path / "cluster-work"
    orbit(
        server.env(), "clusters", "add", "here", "--local", "--slurm-conf", str(slurm.conf),
        "--work-dir", str(work),
    )  # fmt: skip
    return server, {"template": "slurm", "overrides": {"target": "here"}}, [work]


def api(server: Server, path: str) -> str:
    with server.client() as http:
        answer = http.get(path)
        assert answer.status_code == 200, answer.text
        return answer.text


@pytest.mark.parametrize("kind", ["agent", "ssh", "slurm"])
def test_a_secret_reaches_the_task_on_each_placement_and_nothing_orbit_keeps_holds_it(
    kind: str,
    request: pytest.FixtureRequest,
    start_server: Callable[..., Server],
    tmp_path: Path,
) -> None:
    server, where, elsewhere = place(kind, request, start_server, tmp_path)
    env = server.env()
    set_secret(server, VALUE)
    flag = tmp_path / "go"
    command = (
        'echo "token=$HF_TOKEN"; printf %s "$HF_TOKEN" | base64; '
        'printf %s "$HF_TOKEN" | sha256sum; '
        f"while [ ! -e {flag} ]; do sleep 0.1; done"
    )
    spec = write_spec(
        tmp_path, task={"command": command}, secrets={"HF_TOKEN": "hf"},
        retry={"max_retries": 0}, **where,
    )  # fmt: skip
    run_id = str(orbit_json(env, "submit", str(spec))["id"])

    def logs() -> str:
        return orbit(env, "logs", run_id, check=False).stdout

    try:
        eventually(lambda: sha(VALUE) in logs() or None, timeout=120, every=0.3)
    except AssertionError:
        raise AssertionError(f"{orbit(env, 'runs', 'show', run_id).stdout}\n{logs()}") from None
    # while it runs: no command line on this machine carries the value
    listed = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert_masked("ps", listed.stdout)
    rotated = orbit_json(env, "secrets", "rotate-key")  # under the running task
    assert rotated["resealed"] == 1
    flag.touch()

    def ended() -> dict[str, Any] | None:
        run = orbit_json(env, "runs", "show", run_id)
        return run if run["state"] in ("succeeded", "failed", "terminated") else None

    run = eventually(ended, timeout=120, every=0.3)
    assert run["state"] == "succeeded", run
    shown = logs()
    assert "token=***" in shown and sha(VALUE) in shown, shown
    assert_masked("orbit logs", shown)
    dest = tmp_path / "collected"
    orbit(env, "collect", run_id, "--dest", str(dest))
    collected = (dest / "training.log").read_bytes()
    assert b"token=***" in collected
    assert_masked("collected training.log", collected)
    audit = orbit(env, "audit", "export", "--json").stdout
    assert "secret.used" in audit and "secret.key_rotated" in audit
    assert_masked("audit", audit)
    assert_masked("the API", api(server, f"/api/v1/runs/{run_id}"))
    assert_masked("metrics", api(server, "/metrics"))

    # the value changes: a retry uses the new one
    set_secret(server, NEW)
    orbit(env, "retry", run_id)

    def retried() -> dict[str, Any] | None:
        run = ended()
        return run if run is not None and len(run["attempts"]) == 2 else None

    again = eventually(retried, timeout=120, every=0.3)
    assert again["state"] == "succeeded", again
    shown = logs()
    assert sha(NEW) in shown and sha(VALUE) not in shown, shown
    assert_masked("orbit logs of the retry", shown)

    # nothing on disk of the server, the node, the host or the cluster, nor in the store
    for folder in (tmp_path, *elsewhere):
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert_masked(str(path), path.read_bytes())
    assert_masked("the store", every_row(server.database_url))

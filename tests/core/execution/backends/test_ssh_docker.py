"""`ssh_docker`: the docker launch mode behind the SSH placement. A real sshd whose sessions
reach the test's private dockerd (DOCKER_HOST set by the server, as a host's own setup would),
driven through the `orbit` CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.core.execution.backends.test_ssh_host_process import orbit, orbit_json
from tests.dockerd import Dockerd
from tests.helpers import write_spec
from tests.sshd import SshdFactory

from orbit.core.execution.docker.host import plane_id


def test_a_container_run_on_an_ssh_host_and_the_sweep_at_hosts_check(
    env: dict[str, str],
    sshd_factory: SshdFactory,
    dockerd: Dockerd,
    orbit_home: Path,
    tmp_path: Path,
) -> None:
    server = sshd_factory(alias="gpu-box", env={"DOCKER_HOST": dockerd.host})
    added = orbit_json(
        env, "hosts", "add", "gpu-box", "--ssh", server.alias, "--work-dir", str(server.work_root)
    )
    assert added["facts"]["docker"] and added["facts"]["docker"] != "client only"
    spec = write_spec(
        tmp_path,
        template="ssh-docker",
        task={"command": ["sh", "-c", 'echo "in a container on the host: $ORBIT_ATTEMPT_ID"']},
        overrides={"target": "gpu-box", "image": dockerd.image, "resources": {"gpu_count": 0}},
    )
    refused = orbit(env, "submit", str(spec), "--set", "resources.gpu_count=1", check=False)
    assert refused.returncode == 2 and "reported 0 GPUs" in refused.stderr
    run = orbit_json(env, "submit", str(spec), "--wait")
    attempt = run["attempts"][0]
    assert run["state"] == "succeeded", attempt
    assert attempt["handle"]["backend_key"] == "ssh_docker"
    location = Path(attempt["handle"]["location"])
    assert location.parent == server.work_root / "attempts"
    training = (location / "artifacts" / "training.log").read_text()
    assert f"in a container on the host: {attempt['id']}" in training
    image = json.loads((location / "runtime" / "image.json").read_text())
    assert image["id"] == dockerd.image_id(dockerd.image)
    assert not dockerd.containers(f"label=orbit.attempt={attempt['id']}")  # none left behind

    # ORBIT containers on the host that no live attempt owns go at the next check; others stay
    plane = plane_id(orbit_home / "work")
    ours = ["--label", "orbit.managed=1", "--label", f"orbit.plane={plane}"]
    dockerd.docker(
        "run", "-d", "--name", "ssh-orphan", *ours, "--label", "orbit.attempt=run-gone-1",
        dockerd.image, "sleep", "300",
    )  # fmt: skip
    dockerd.docker("run", "-d", "--name", "ssh-stranger", dockerd.image, "sleep", "300")
    try:
        checked = orbit_json(env, "hosts", "check", "gpu-box")
        assert checked["removed_containers"] == ["ssh-orphan"]
        left = dockerd.containers()
        assert "ssh-orphan" not in left and "ssh-stranger" in left
        swept = [e for e in orbit_json(env, "audit") if e["action"] == "host.swept"]
        assert swept and swept[0]["data"]["attempts"] == ["run-gone-1"]
    finally:
        dockerd.docker("rm", "-f", "ssh-orphan", "ssh-stranger", check=False)

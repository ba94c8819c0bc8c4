"""What is recorded is what runs, and a submit makes one run however often it is sent: against
real `orbit server` processes on SQLite and PostgreSQL.

A hand-made client (httpx) that sends a task_request saying one command and a shaped task that
runs another is refused, and nothing is stored. A submit sent again with its idempotency key
is answered with the run it made; and `orbit.Client`, whose answers a SIGKILLed server loses
mid-submit, sends its submits again with their keys to the restarted server: 50 submits, 50
runs, none lost and none twice."""

from __future__ import annotations

import io
import json
import signal
import tarfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from orbit import Client
from orbit.core.control.submit import gather_inputs
from orbit.core.tasks import TaskRegistry
from orbit.model.spec import SubmitSpec, to_submission
from orbit.store import Store
from tests.orbit_server import Server
from tests.store.raw import query

PROBLEM = "application/problem+json"


def form_of(spec: dict[str, Any], base: Path) -> tuple[dict[str, str], bytes]:
    """A submission's form fields and its inputs' tar.gz, as the real client makes them
    (orbit.client.remote.RemoteControl._upload)."""
    submission = to_submission(SubmitSpec.model_validate(spec), "spec.yaml", False, True)
    inputs = base / f"gathered-{uuid.uuid4().hex[:8]}"
    shaped = gather_inputs(TaskRegistry(), submission, base, "spec.yaml", inputs)
    form = {
        "submission": submission.model_dump_json(exclude_unset=True),
        "shaped": shaped.model_dump_json(),
        "source": "spec.yaml",
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(inputs, arcname=".")
    return form, out.getvalue()


def post(
    http: httpx.Client, form: dict[str, str], archive: bytes, key: str | None = None
) -> httpx.Response:
    files = {"inputs": ("inputs.tar.gz", archive, "application/gzip")}
    headers = {"Idempotency-Key": key} if key else {}
    return http.post("/api/v1/runs", data=form, files=files, headers=headers)


def run_ids(http: httpx.Client) -> list[str]:
    page = http.get("/api/v1/runs", params={"limit": 1000}).json()
    return [view["run"]["id"] for view in page["runs"]]


def spec(command: str, template: str = "local") -> dict[str, Any]:
    return {
        "experiment": "once",
        "task_type": "command",
        "template": template,
        "task": {"command": command},
    }


# -- what is recorded is what runs --------------------------------------------------------------


def test_a_client_cannot_freeze_an_entrypoint_its_task_request_does_not_show(
    orbit_server: Server, tmp_path: Path
) -> None:
    marker = tmp_path / "the-other-command-ran"
    form, archive = form_of(spec("echo recorded"), tmp_path)
    shaped = json.loads(form["shaped"])
    other = f"touch {marker}"
    attacks = [
        {**shaped, "entrypoint": ["bash", "-c", other], "shell_command": other},
        {**shaped, "env": {"BASH_ENV": "/tmp/evil.sh"}},
    ]
    with orbit_server.client() as http:
        events = http.get("/api/v1/audit").json()
        for attack, field in zip(attacks, ("entrypoint", "env"), strict=True):
            answer = post(http, {**form, "shaped": json.dumps(attack)}, archive)
            assert answer.status_code == 422, answer.text
            assert answer.headers["content-type"] == PROBLEM
            detail = answer.json()["detail"]
            assert detail.startswith(
                f"spec.yaml: shaped.{field}: does not match what task_request gives"
            ), detail
            assert "\n" not in detail
        # nothing stored: no run, no audit event, no bundle; and nothing ran
        assert run_ids(http) == []
        assert http.get("/api/v1/audit").json() == events
        bundles = orbit_server.home / "bundles"
        assert not bundles.exists() or not [p for p in bundles.iterdir() if p.is_dir()]
        # the same submission as its client shaped it is taken, and runs what it records
        answer = post(http, form, archive)
        assert answer.status_code == 201, answer.text
        assert answer.json()["submission"]["task_request"]["command"] == "echo recorded"
    time.sleep(1.0)
    assert not marker.exists()


# -- idempotency keys ---------------------------------------------------------------------------


def test_a_key_sent_again_gets_its_run_and_a_key_used_for_another_request_is_refused(
    orbit_server: Server, tmp_path: Path
) -> None:
    form, archive = form_of(spec("true", "pool"), tmp_path)
    with orbit_server.client() as http:
        first = post(http, form, archive, key="k-1")
        assert first.status_code == 201, first.text
        again = post(http, form, archive, key="k-1")
        assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
        assert run_ids(http) == [first.json()["id"]]
        # the same key with another submission is a mistake, named
        other, other_archive = form_of(spec("echo other", "pool"), tmp_path)
        refused = post(http, other, other_archive, key="k-1")
        assert refused.status_code == 409, refused.text
        assert (
            "Idempotency-Key k-1: already used for a different request" in refused.json()["detail"]
        )
        bad = post(http, form, archive, key="not a key!")
        assert bad.status_code == 422 and "Idempotency-Key" in bad.json()["detail"]
        # no key: each submit is a run of its own, as before
        assert post(http, form, archive).json()["id"] != first.json()["id"]
        # a replay with a key, sent twice: one replay
        replays = [
            http.post(f"/api/v1/runs/{first.json()['id']}/replay", headers={"Idempotency-Key": "r"})
            for _ in range(2)
        ]
        assert [r.status_code for r in replays] == [201, 201]
        assert replays[0].json()["id"] == replays[1].json()["id"]
        assert replays[0].json()["replay_of"] == first.json()["id"]
        assert len(run_ids(http)) == 3
        # keys are per user: another user's k-1 is theirs
        assert http.post("/api/v1/users", json={"name": "ann", "role": "member"}).status_code == 201
        token = http.post("/api/v1/tokens", json={"user": "ann"}).json()["token"]
    with orbit_server.client(token) as ann:
        theirs = post(ann, form, archive, key="k-1")
        assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
        assert theirs.json()["created_by"] == "ann"


def test_a_submit_whose_answer_timed_out_is_sent_again_and_makes_one_run(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """The client gives up waiting (its read timeout) while the server still works on the
    submit; it sends it again with the same key, and gets the run the first one made."""
    from orbit.client.remote import RemoteControl

    server = start_server("--no-loops", env={"ORBIT_FAILPOINTS": "after-submit=sleep:1.5"})
    with Client._of(RemoteControl(server.url, server.admin_token, timeout_s=0.5)) as client:
        run = client.submit(spec("true", "pool"), base_dir=tmp_path, queue_anyway=True)
    with server.client() as http:
        assert run_ids(http) == [run.id]


KILLS = 3  # SIGKILLs, each while a submit is committed and its answer not yet sent
SUBMITS = 50


def test_kill_9_during_50_retried_submits_loses_none_and_makes_none_twice(
    start_server: Callable[..., Server], store_url: str, tmp_path: Path
) -> None:
    """Each submit sleeps a moment after its run is committed, before it answers (a
    failpoint), and the server is killed in that moment three times over: those answers are
    lost, and the clients send their submits again, with their keys, to the next server."""
    env = {"ORBIT_FAILPOINTS": "after-submit=sleep:0.3"}
    server = start_server("--no-loops", env=env)
    port = urlparse(server.url).port
    answered: list[str] = []
    lock = threading.Lock()

    def submit(n: int) -> str:
        with Client(server.url, server.admin_token) as client:
            run = client.submit(spec(f"echo {n}", "pool"), base_dir=tmp_path, queue_anyway=True)
        with lock:
            answered.append(run.id)
        return str(run.id)

    store = Store(store_url)
    try:

        def committed_unanswered() -> bool:
            runs = query(store, "SELECT count(*) AS n FROM runs")[0]["n"]
            with lock:
                return int(runs) > len(answered)

        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = [pool.submit(submit, n) for n in range(SUBMITS)]
            for kill in range(KILLS):
                while len(answered) < (kill + 1) * SUBMITS // (KILLS + 1):
                    time.sleep(0.01)
                deadline = time.monotonic() + 20
                while not committed_unanswered():
                    assert time.monotonic() < deadline, "no submit was ever caught mid-answer"
                    time.sleep(0.005)
                server.stop(signal.SIGKILL)
                server = start_server("--no-loops", port=port, env=env)
            made = [f.result(timeout=120) for f in futures]
        stored = [row["id"] for row in query(store, "SELECT id FROM runs")]
        keys = query(store, "SELECT count(*) AS n FROM submit_keys")[0]["n"]
    finally:
        store.close()
    assert len(set(made)) == SUBMITS  # every submit got a run of its own
    assert sorted(stored) == sorted(made)  # and the store has those, no more
    assert keys == SUBMITS
    with server.client() as http:
        commands = {
            view["run"]["submission"]["task_request"]["command"]
            for view in http.get("/api/v1/runs", params={"limit": 1000}).json()["runs"]
        }
    assert commands == {f"echo {n}" for n in range(SUBMITS)}

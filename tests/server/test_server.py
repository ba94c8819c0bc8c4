"""`orbit server` as a team uses it: a real server process on loopback, the real CLI (and the
Python client) against it. Users, roles and tokens; the audit's actor; loops that move runs
with nobody looking; logs that survive dropped connections; metrics; TLS."""

from __future__ import annotations

import json
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from orbit.store import Store
from tests.helpers import ORBIT, eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.proxy import CuttingProxy


def token_for(server: Server, user: str, role: str) -> str:
    admin = server.env()
    orbit(admin, "users", "add", user, "--role", role)
    return str(orbit_json(admin, "tokens", "create", "--user", user)["token"])


def test_first_start_writes_the_admin_token_once_and_the_store_keeps_only_hashes(
    orbit_server: Server, store_url: str, start_server: object
) -> None:
    token_file = orbit_server.home / "admin-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = orbit_server.admin_token
    assert token.startswith("orbit_") and len(token) == len("orbit_") + 43
    assert "admin-token" in orbit_server.output()  # its log says where the token is
    made = orbit_json(orbit_server.env(), "tokens", "create", "--name", "ci", "--expires", "30d")
    assert made["token"].startswith("orbit_") and made["user"] == "admin"
    store = Store(store_url)
    try:
        with store.db.transaction(write=False) as tx:
            rows = tx.all("SELECT * FROM tokens")
        dumped = json.dumps([{k: str(v) for k, v in r.items()} for r in rows])
        events = json.dumps([e.data for e in store.audit.list_events()])
    finally:
        store.close()
    assert len(rows) == 2
    for plain in (token, made["token"]):
        assert plain not in dumped and plain not in events  # hashes only, never the token
    # a restart on a store with users writes no new token
    orbit_server.stop()
    token_file.unlink()
    again = start_server()  # type: ignore[operator]
    assert not token_file.exists()
    assert orbit_json(again.env(token), "whoami")["name"] == "admin"


def test_roles_decide_who_may_do_what_and_the_audit_names_who_did_it(
    members_here: Server, tmp_path: Path
) -> None:
    orbit_server = members_here
    admin = orbit_server.env()
    member = orbit_server.env(token_for(orbit_server, "mia", "member"), ORBIT_ACTOR="mallory")
    viewer = orbit_server.env(token_for(orbit_server, "vic", "viewer"))
    spec = write_spec(tmp_path, task={"command": "sleep 30"})

    # a viewer reads, and nothing more
    assert orbit_json(viewer, "runs", "list") == []
    refused = orbit(viewer, "submit", str(spec), check=False)
    assert refused.returncode == 2
    assert refused.stderr == (
        "orbit: error: vic (viewer) may not submit runs: that needs the permission runs.submit\n"
    )
    assert orbit(viewer, "users", "list", check=False).returncode == 2

    # a member submits; the audit names the token's user, never what the client claims
    mine = orbit_json(member, "submit", str(spec))["id"]
    assert mine and orbit_json(member, "runs", "show", mine)["created_by"] == "mia"
    created = [e for e in orbit_json(admin, "audit", "--run", mine) if e["action"] == "run.created"]
    assert [e["actor"] for e in created] == ["mia"]
    assert "mallory" not in orbit(admin, "audit").stdout

    # ... and controls its own runs, not someone else's
    theirs = orbit_json(admin, "submit", str(spec))["id"]
    denied = orbit(member, "cancel", theirs, check=False)
    assert denied.returncode == 2
    assert (
        "admin's run: mia (member) may not cancel anyone's runs: that needs the permission "
        "runs.cancel.any" in denied.stderr
    )
    assert orbit_json(member, "cancel", mine)["state"] == "terminated"
    assert orbit(viewer, "cancel", theirs, check=False).returncode == 2
    assert orbit_json(admin, "cancel", theirs)["state"] == "terminated"  # an admin does anything
    cancels = [e for e in orbit_json(admin, "audit", "--run", mine) if "cancel" in e["action"]]
    assert cancels and {e["actor"] for e in cancels} == {"mia"}

    # users and tokens are the admin's
    assert orbit(member, "users", "add", "eve", check=False).returncode == 2
    assert orbit(member, "tokens", "create", "--user", "vic", check=False).returncode == 2
    assert [t["user"] for t in orbit_json(member, "tokens", "list")] == ["mia"]
    users = {u["name"]: u["role"] for u in orbit_json(admin, "users", "list")}
    assert users == {"admin": "admin", "mia": "member", "vic": "viewer"}


def test_a_revoked_expired_or_removed_users_token_is_refused_at_once(
    orbit_server: Server,
) -> None:
    admin = orbit_server.env()
    token = token_for(orbit_server, "tom", "member")
    assert orbit_json(orbit_server.env(token), "whoami")["name"] == "tom"
    token_id = orbit_json(orbit_server.env(token), "tokens", "list")[0]["id"]
    orbit(admin, "tokens", "revoke", token_id)
    refused = orbit(orbit_server.env(token), "runs", "list", check=False)
    assert refused.returncode == 2
    assert refused.stderr.startswith("orbit: error: the token was not accepted")
    assert len(refused.stderr.splitlines()) == 1

    short = orbit_json(admin, "tokens", "create", "--user", "tom", "--expires", "3s")["token"]
    with orbit_server.client(short) as http:  # quicker than a CLI process on a busy machine
        assert http.get("/api/v1/whoami").status_code == 200
        time.sleep(3.2)
        assert http.get("/api/v1/whoami").status_code == 401
    assert orbit(orbit_server.env(short), "whoami", check=False).returncode == 2

    kept = orbit_json(admin, "tokens", "create", "--user", "tom")["token"]
    orbit(admin, "users", "remove", "tom")
    assert orbit(orbit_server.env(kept), "whoami", check=False).returncode == 2
    missing = orbit(orbit_server.env(""), "runs", "list", check=False)
    assert missing.returncode == 2 and "needs a token" in missing.stderr


def test_login_saves_the_token_0600_and_later_commands_use_it(
    orbit_server: Server, tmp_path: Path
) -> None:
    home = tmp_path / "laptop"
    env = {k: v for k, v in orbit_server.env().items() if k not in ("ORBIT_SERVER", "ORBIT_TOKEN")}
    env["ORBIT_HOME"] = str(home)
    wrong = tmp_path / "wrong-token"
    wrong.write_text("orbit_wrong\n", encoding="utf-8")
    bad = orbit(env, "login", orbit_server.url, "--token-file", str(wrong), check=False)
    assert bad.returncode == 2 and not (home / "credentials.json").exists()
    token_file = orbit_server.home / "admin-token"
    said = orbit(env, "login", orbit_server.url, "--token-file", str(token_file)).stdout
    assert said.startswith(f"logged in to {orbit_server.url} as admin (admin)")
    saved = home / "credentials.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert orbit_json(env, "whoami")["name"] == "admin"
    run = orbit_json(env, "submit", str(write_spec(tmp_path)))
    assert orbit_json(env, "runs", "list")[0]["id"] == run["id"]
    orbit(env, "logout")
    assert orbit_json(env, "runs", "list") == []  # embedded again: its own, empty store


def test_loops_finish_and_retry_runs_with_nobody_looking(
    orbit_server: Server, tmp_path: Path
) -> None:
    spec = write_spec(
        tmp_path,
        task={"command": "echo try; exit 3"},
        retry={"max_retries": 2, "on_exit_codes": [3], "backoff_s": 0.5},
    )
    run_id = orbit_json(orbit_server.env(), "submit", str(spec))["id"]
    with orbit_server.client() as http:  # reads the store only: in server mode, reads never look

        def ended() -> dict[str, object] | None:
            run = http.get(f"/api/v1/runs/{run_id}").json()
            done = len(run["attempts"]) == 3 and run["attempts"][-1]["state"] == "failed"
            return run if done else None

        run = eventually(ended, timeout=30)
    assert [a["exit_code"] for a in run["attempts"]] == [3, 3, 3]  # type: ignore[index]
    assert [a["trigger"] for a in run["attempts"]] == ["submit", "auto_retry", "auto_retry"]  # type: ignore[index]


@pytest.fixture
def flaky(orbit_server: Server) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(orbit_server.url, cut_after=40_000)
    yield proxy
    proxy.close()


def test_logs_follow_over_sse_resumes_after_dropped_connections_with_nothing_lost_or_repeated(
    orbit_server: Server, flaky: CuttingProxy, tmp_path: Path
) -> None:
    script = "for i in $(seq 1 20000); do echo line-$i; [ $((i % 4000)) = 0 ] && sleep 0.3; done"
    spec = write_spec(tmp_path, task={"command": script})
    run_id = orbit_json(orbit_server.env(), "submit", str(spec))["id"]
    env = orbit_server.env(ORBIT_SERVER=flaky.url)
    followed = orbit(env, "logs", run_id, "--follow", timeout=120)
    assert followed.stdout == "".join(f"line-{i}\n" for i in range(1, 20001))
    assert flaky.cuts >= 3  # the stream really was broken off, more than once
    assert followed.stderr.strip().endswith("attempt 1 succeeded: exit 0")

    # the raw stream: the event id is the byte offset after the event's bytes
    with orbit_server.client() as http:
        text = http.get(f"/api/v1/runs/{run_id}/logs/training").text
        resumed = http.get(
            f"/api/v1/runs/{run_id}/logs/training", headers={"Last-Event-ID": "5"}
        ).text
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids[-1] == len(followed.stdout.encode())
    assert "event: end" in text and '"ended": true' in text
    first = next(line for line in resumed.splitlines() if line.startswith("data: "))
    import base64

    assert base64.b64decode(first[6:]).startswith(b"1\nline-2\n")  # from byte 5: "line-|1"


def test_the_python_client_against_a_real_server(orbit_server: Server, tmp_path: Path) -> None:
    from orbit import Client
    from orbit.model.records import CollectResult, RunRecord

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(
        "import os\nfor i in range(3): print('step', i)\n"
        "os.makedirs('artifacts', exist_ok=True)\n"
        "open(os.path.join(os.environ['ORBIT_ARTIFACTS_DIR'], 'model.txt'), 'w').write('w')\n"
    )
    spec = {
        "experiment": "nb",
        "task_type": "python",
        "template": "local",
        "task": {"script": "train.py"},
    }
    with Client(orbit_server.url, orbit_server.admin_token) as client:
        run = client.submit(spec, base_dir=tmp_path / "job")
        assert isinstance(run.record, RunRecord) and not run.state.terminal
        assert b"".join(run.logs(follow=True)) == b"step 0\nstep 1\nstep 2\n"
        record = run.wait(timeout=30)
        assert isinstance(record, RunRecord) and record.state.value == "succeeded"
        assert b"".join(run.logs(tail=1)) == b"step 2\n"
        assert b"".join(run.logs(since=datetime.now(UTC))) == b""
        assert [r.id for r in client.runs(experiment="nb")] == [run.id]
        assert client.run(run.id[:10]).id == run.id
        got = run.collect(tmp_path / "out")
        assert isinstance(got, CollectResult) and got.verified
        assert (tmp_path / "out" / "model.txt").read_text() == "w"
        again = run.retry()
        assert len(again.attempts) == 2
        assert run.cancel().state.value in {"terminated", "succeeded"}
        from orbit.model.errors import NotFound

        with pytest.raises(NotFound, match="unknown run"):
            client.run("run-doesnotexist")


def test_metrics_are_prometheus_text_without_ids(orbit_server: Server, tmp_path: Path) -> None:
    run_id = orbit_json(orbit_server.env(), "submit", str(write_spec(tmp_path)))["id"]
    orbit(orbit_server.env(), "runs", "show", run_id)
    assert httpx.get(f"{orbit_server.url}/healthz").json()["status"] == "ok"  # no token
    assert httpx.get(f"{orbit_server.url}/api/v1/runs").status_code == 401
    assert httpx.get(f"{orbit_server.url}/metrics").status_code == 401
    assert httpx.get(f"{orbit_server.url}/openapi.json").status_code == 401
    with orbit_server.client(token_for(orbit_server, "prometheus", "viewer")) as http:
        text = http.get("/metrics").text
        assert http.get("/openapi.json").json()["paths"]["/api/v1/runs/{ref}"]
    assert 'orbit_submissions_total{outcome="accepted"} 1.0' in text
    assert 'orbit_runs{state="' in text
    assert 'route="/api/v1/runs/{ref}/view"' in text
    assert "orbit_http_request_duration_seconds_bucket" in text
    assert "orbit_reconcile_lag_seconds" in text
    assert run_id not in text and run_id[4:] not in text


def test_tls_with_uvicorns_certificate_options(start_server: object, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server = start_server(  # type: ignore[operator]
        "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), scheme="https", verify=str(cert)
    )
    assert server.url.startswith("https://")
    env = server.env(SSL_CERT_FILE=str(cert))
    assert orbit_json(env, "whoami")["name"] == "admin"
    plain = {**env, "ORBIT_SERVER": server.url.replace("https://", "http://")}
    assert orbit(plain, "whoami", check=False).returncode != 0
    unknown_ca = {**env, "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    failed = subprocess.run([*ORBIT, "whoami"], env=unknown_ca, capture_output=True, text=True)
    assert failed.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in failed.stderr
    assert "Traceback" not in failed.stderr

"""Alerts raised by real faults through a real `orbit server` on both stores, delivered to real
webhook receivers on loopback: an agent killed (its node goes offline: raised once however
often the loop looks, resolved when the agent is back), a run that cannot be placed waits
past the threshold, a receiver that answers 500 is tried again; a member lists them but only
an admin acknowledges or silences (a silenced alert's resolution is not sent); the rules file
for Prometheus."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orbit.store import Store
from tests.agents import NVML_DATA, AgentProc, nvml_env, wait_online, with_xids
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.server.test_console import token_for
from tests.store.raw import execute


class Receiver:
    """A webhook receiver on loopback: what it was posted, in order; it answers 500 to the
    first `fail_first` posts."""

    def __init__(self, fail_first: int = 0) -> None:
        self.posts: list[dict[str, Any]] = []
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_response(500)
                else:
                    outer.posts.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    plain, slack = Receiver(fail_first=1), Receiver()
    yield plain, slack
    plain.close()
    slack.close()


def events(receiver: Receiver, kind: str) -> list[tuple[str, int]]:
    return [(p["event"], p["alert"]["id"]) for p in receiver.posts if p["alert"]["kind"] == kind]


def test_real_faults_raise_alerts_delivered_once_and_resolved(
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    receivers: tuple[Receiver, Receiver],
    tmp_path: Path,
) -> None:
    plain, slack = receivers
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"alerts": {
        "every_s": 0.3, "run_waiting_s": 2, "retries_over": 2,
        "webhooks": [{"url": plain.url}, {"url": slack.url, "kind": "slack"}],
    }}))  # fmt: skip
    server = start_server(
        "--config", str(config), env={"ORBIT_NODE_OFFLINE_S": "3", "ORBIT_NODE_HEARTBEAT_S": "1"}
    )
    admin = server.env()
    mia = server.env(token_for(server, "mia", "member"))
    agent = start_agent(server, "gpu-a")
    # a node whose GPU 1 reports XID 79 (fallen off the bus), from a replayed NVML recording
    xids = with_xids(NVML_DATA / "h100-recording.json", tmp_path / "xids.json", [None, (1, 79)])
    start_agent(server, "h100x2", env=nvml_env(xids))
    wait_online(server, "gpu-a", "h100x2")
    bus = eventually(lambda: events(plain, "gpu_unhealthy"), timeout=30, every=0.2)
    gpu = next(a for a in orbit_json(mia, "alerts", "list") if a["id"] == bus[0][1])
    assert gpu["message"] == "h100x2 GPU 1: xid 79" and gpu["objects"]["gpu"] == "1"
    assert gpu["remedy"].startswith("drain: orbit nodes drain h100x2; runs on it will be retried")
    # a run no node can hold waits past the threshold
    spec = write_spec(tmp_path, template="pool", task={"command": "true"})
    run = orbit_json(mia, "submit", str(spec), "--set", "resources.gpu_count=8", "--queue-anyway")
    waiting = eventually(lambda: events(plain, "run_waiting"), timeout=30, every=0.2)
    assert waiting[0][0] == "raised"  # after a 500: tried again
    # the agent killed: its node goes offline, raised once however often the loop looks
    agent.kill()
    eventually(lambda: events(plain, "node_offline"), timeout=30, every=0.2)
    listed = orbit_json(mia, "alerts", "list")
    offline = next(a for a in listed if a["kind"] == "node_offline")
    assert offline["objects"] == {"node": "gpu-a"} and offline["severity"] == "critical"
    assert "orbit nodes drain gpu-a" in offline["remedy"]
    assert offline["message"].startswith("gpu-a: no word for ")
    texts = [p["text"] for p in slack.posts]
    assert any(t.startswith(":rotating_light: [critical] gpu-a: no word for") for t in texts)
    assert any("orbit nodes drain gpu-a" in t for t in texts)
    # only an admin acknowledges or silences
    refused = orbit(mia, "alerts", "ack", str(offline["id"]), check=False)
    assert refused.returncode == 2 and "permission alerts.manage" in refused.stderr
    orbit(admin, "alerts", "ack", str(offline["id"]))
    waiting_id = waiting[0][1]
    orbit(admin, "alerts", "silence", str(waiting_id), "--for", "1h")
    # the agent back: resolved, and said so once
    agent.start()
    eventually(
        lambda: ("resolved", offline["id"]) in events(plain, "node_offline"), timeout=30, every=0.2
    )
    assert events(plain, "node_offline") == [("raised", offline["id"]), ("resolved", offline["id"])]
    # the waiting run cancelled: resolved, but silenced, so not sent
    orbit(admin, "cancel", run["id"])
    eventually(
        lambda: all(a["resolved_at"] for a in orbit_json(admin, "alerts", "list", "--all")
                    if a["id"] == waiting_id) or None, timeout=30, every=0.2,
    )  # fmt: skip
    every = {a["id"]: a for a in orbit_json(admin, "alerts", "list", "--all")}
    assert every[offline["id"]]["acked_by"] == "admin" and every[offline["id"]]["resolved_at"]
    assert every[waiting_id]["silenced_until"] is not None
    assert ("resolved", waiting_id) not in events(plain, "run_waiting")
    assert [a["kind"] for a in orbit_json(admin, "alerts", "list")] == ["gpu_unhealthy"]
    audit = orbit(admin, "audit", "export", "--json").stdout
    assert "alert.raised" in audit and "alert.acknowledged" in audit and "alert.resolved" in audit
    rules = yaml.safe_load(orbit(mia, "alerts", "rules").stdout)
    names = [r["alert"] for r in rules["groups"][0]["rules"]]
    assert "OrbitNodeOffline" in names and "OrbitGpuUnhealthy" in names
    assert all(r["annotations"]["remedy"] for r in rules["groups"][0]["rules"])


def test_a_stalled_run_a_starved_user_a_low_disk_and_a_tampered_audit_raise_alerts(
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    receivers: tuple[Receiver, Receiver],
    store_url: str,
    tmp_path: Path,
) -> None:
    plain, _ = receivers
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"alerts": {
        "every_s": 0.3, "no_progress_s": 3, "starved_s": 2, "audit_every_s": 0.5,
        # more free disk than any work dir here has: every node's disk is "nearly full"
        "disk_free_mb": 1024 * 1024 * 1024, "webhooks": [{"url": plain.url}],
    }}))  # fmt: skip
    server = start_server("--config", str(config))
    admin = server.env()
    mia = server.env(token_for(server, "mia", "member"))
    start_agent(server, "cpu-a")
    wait_online(server, "cpu-a")
    # a node whose work dir's disk is under the threshold
    disk = eventually(lambda: events(plain, "disk_low"), timeout=30, every=0.2)
    low = next(a for a in orbit_json(mia, "alerts", "list") if a["id"] == disk[0][1])
    assert low["objects"] == {"node": "cpu-a"} and "free in its work dir" in low["message"]
    assert "orbit gc" in low["remedy"] and "orbit nodes drain cpu-a" in low["remedy"]

    # a run that logs three steps, then hangs: no progress past no_progress_s
    steps = (
        'for i in 1 2 3; do echo "{\\"step\\": $i, \\"loss\\": 0.5}" '
        ">> $ORBIT_ARTIFACTS_DIR/logging.jsonl; done; sleep 120"
    )
    spec = write_spec(tmp_path, template="pool", task={"command": steps})
    hung = orbit_json(mia, "submit", str(spec))["id"]
    stalled = eventually(lambda: events(plain, "run_stalled"), timeout=60, every=0.2)
    alert = next(a for a in orbit_json(mia, "alerts", "list") if a["id"] == stalled[0][1])
    assert alert["objects"] == {"run": hung, "user": "mia"}
    assert alert["message"].startswith(f"{hung} of mia has logged no progress for ")
    assert alert["message"].endswith(" at step 3")
    assert f"orbit cancel {hung}" in alert["remedy"]
    orbit(mia, "cancel", hung)
    eventually(lambda: ("resolved", alert["id"]) in events(plain, "run_stalled"), timeout=30)

    # mia's runs wait while she holds none of her 4 GPUs: starved
    orbit(admin, "quotas", "set", "user", "mia", "--gpus", "4")
    spec = write_spec(tmp_path, template="pool", task={"command": "true"})
    waits = orbit_json(mia, "submit", str(spec), "--set", "resources.gpu_count=8", "--queue-anyway")
    starved = eventually(lambda: events(plain, "user_starved"), timeout=30, every=0.2)
    alert = next(a for a in orbit_json(mia, "alerts", "list") if a["id"] == starved[0][1])
    assert alert["objects"] == {"user": "mia", "run": waits["id"]}
    assert alert["message"].endswith("while mia holds 0 of 4 GPUs (quota)")
    assert "orbit quotas set user mia" in alert["remedy"]
    # the console's alerts page: what is wrong and the remedy; a member has no buttons there
    as_mia = {"Authorization": f"Bearer {mia['ORBIT_TOKEN']}"}
    shown = httpx.get(f"{server.url}/ui/alerts", headers=as_mia)
    assert shown.status_code == 200
    assert alert["message"].replace("'", "&#39;") in shown.text and "Acknowledge" not in shown.text
    refused = httpx.post(f"{server.url}/ui/alerts/{alert['id']}/ack", headers=as_mia)
    assert refused.status_code == 403 and "alerts.manage" in refused.text
    as_admin = {"Authorization": f"Bearer {server.admin_token}"}
    assert "Acknowledge" in httpx.get(f"{server.url}/ui/alerts", headers=as_admin).text
    httpx.post(f"{server.url}/ui/alerts/{alert['id']}/ack", headers=as_admin)
    acked = next(a for a in orbit_json(mia, "alerts", "list") if a["id"] == alert["id"])
    assert acked["acked_by"] == "admin"

    # an audit event changed under the server: the chain's check fails, said as critical
    store = Store(store_url)
    try:
        first = store.audit.list_events()[0]
        execute(store, "UPDATE events SET actor = 'mallory' WHERE id = :id", id=first.id)
    finally:
        store.close()
    broken = eventually(lambda: events(plain, "audit_broken"), timeout=30, every=0.2)
    alert = next(a for a in orbit_json(admin, "alerts", "list") if a["id"] == broken[0][1])
    assert alert["severity"] == "critical"
    assert alert["message"].startswith(f"the audit chain fails its check: event {first.id}: ")
    assert "orbit audit verify" in alert["remedy"]
    # each is one of /metrics' open alerts, as the rules file expects
    scraped = orbit(admin, "alerts", "rules").stdout
    assert 'orbit_alerts_open{kind="run_stalled"} > 0' in scraped
    metrics = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.admin_token}"}
    ).text
    assert 'orbit_alerts_open{kind="audit_broken",severity="critical"} 1.0' in metrics

"""The `http` task type end to end: a small HTTP service on loopback stands in for the node's
model server (vLLM's OpenAI-compatible server, say); ORBIT sends it a batch with at most
`concurrency` requests in flight and keeps every response, locally and on an agent node."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, sqlite_env, write_spec
from tests.orbit_server import Server


class ModelServer(ThreadingHTTPServer):
    """Answers POST /v1/echo with {"got": body}; /v1/flaky with 500 for every 10th body
    (by its "i"); counts how many requests were in flight at most."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.in_flight = self.most = self.served = 0
        self.refused: dict[int, float] = {}  # /v1/busy: body "i" -> when it was sent away
        self.waited: dict[int, float] = {}  # ... and how long until it came again

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: ModelServer

    def do_POST(self) -> None:
        with self.server.lock:
            self.server.in_flight += 1
            self.server.most = max(self.server.most, self.server.in_flight)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        time.sleep(0.3 if self.path == "/v1/slow" else 0.01)  # a model takes a moment
        status = 500 if self.path == "/v1/flaky" and body["i"] % 10 == 0 else 200
        if self.path == "/v1/busy" and body["i"] % 5 == 0:  # busy the first time: come back
            with self.server.lock:
                first = body["i"] not in self.server.refused
                if first:
                    self.server.refused[body["i"]] = time.monotonic()
                else:
                    self.server.waited[body["i"]] = (
                        time.monotonic() - self.server.refused[body["i"]]
                    )
                self.server.in_flight -= 1
            if first:
                self.send_response(503 if body["i"] % 10 else 429)
                self.send_header("retry-after", "1")
                self.send_header("content-length", "0")
                self.end_headers()
                return
            with self.server.lock:
                self.server.in_flight += 1
        answer = json.dumps({"got": body, "key": self.headers.get("x-api-key")}).encode()
        with self.server.lock:  # done before the answer leaves: the client may send the next
            self.server.in_flight -= 1
            self.server.served += 1
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    server = ModelServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def batch(folder: Path, n: int) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"i": i, "prompt": f"p{i}"}) + "\n" for i in range(n)))
    return path


def responses(env: dict[str, str], run_id: str, dest: Path) -> list[dict[str, Any]]:
    orbit(env, "collect", run_id, "--dest", str(dest))
    found = list(dest.rglob("responses.jsonl"))
    assert len(found) == 1, found
    return [json.loads(line) for line in found[0].read_text().splitlines()]


def test_a_batch_is_sent_at_the_asked_concurrency_and_every_response_kept(
    model_server: ModelServer, tmp_path: Path
) -> None:
    env = {**sqlite_env(tmp_path / "home", tmp_path / "orbit.db"), "MY_KEY": "k-123"}
    spec = write_spec(
        tmp_path,
        task_type="http",
        task={
            "url": f"{model_server.url}/v1/echo",
            "jsonl_file": batch(tmp_path, 60).name,
            "concurrency": 4,
            "headers_from_env": {"x-api-key": "MY_KEY"},
        },
    )
    run_id = orbit_json(env, "submit", str(spec))["id"]
    followed = orbit(env, "logs", run_id, "--follow")
    assert "60/60 done, 0 failed" in followed.stdout
    got = responses(env, run_id, tmp_path / "out")
    assert sorted(r["index"] for r in got) == list(range(60))
    assert all(r["status"] == 200 and r["error"] is None for r in got)
    assert all(r["response"]["got"]["i"] == r["index"] for r in got)
    assert {r["response"]["key"] for r in got} == {"k-123"}  # from the node's env, not frozen
    assert model_server.most == 4 and model_server.served == 60
    assert orbit_json(env, "status", run_id)["progress"]["step"] == 60
    job = next((tmp_path / "home").rglob("job.json")).read_text()
    assert "k-123" not in job


def test_failed_requests_fail_the_run_counted_by_kind_unless_allowed(
    model_server: ModelServer, tmp_path: Path
) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    task = {"url": f"{model_server.url}/v1/flaky", "jsonl_file": batch(tmp_path, 30).name}
    strict = write_spec(tmp_path, "strict.yaml", task_type="http", task=task)
    run_id = orbit_json(env, "submit", str(strict))["id"]
    followed = orbit(env, "logs", run_id, "--follow", check=False)
    assert followed.returncode == 1
    assert "3 of 30 request(s) failed: http 500 x3" in orbit(env, "inspect", run_id).stdout
    lenient = write_spec(
        tmp_path, "lenient.yaml", task_type="http", task={**task, "allow_failures": 3}
    )
    ok = orbit_json(env, "submit", str(lenient))["id"]
    assert orbit(env, "logs", ok, "--follow").returncode == 0
    failed = [r for r in responses(env, ok, tmp_path / "out") if r["error"]]
    assert sorted(r["index"] for r in failed) == [0, 10, 20]
    assert all(r["status"] == 500 for r in failed)


def test_requests_the_server_could_not_take_are_sent_again_after_its_retry_after(
    model_server: ModelServer, tmp_path: Path
) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    task = {"url": f"{model_server.url}/v1/busy", "jsonl_file": batch(tmp_path, 20).name}
    spec = write_spec(tmp_path, "busy.yaml", task_type="http", task=task)
    run_id = orbit_json(env, "submit", str(spec))["id"]
    assert "20/20 done, 0 failed" in orbit(env, "logs", run_id, "--follow").stdout
    got = {r["index"]: r for r in responses(env, run_id, tmp_path / "out")}
    again = sorted(i for i, r in got.items() if r["tries"] == 2)
    assert again == [0, 5, 10, 15] and all(got[i]["status"] == 200 for i in again)
    assert all(r["tries"] == 1 for i, r in got.items() if i not in again)
    # 503 and 429 alike, each back no sooner than its Retry-After asked (1 s)
    assert sorted(model_server.waited) == again
    assert min(model_server.waited.values()) >= 1.0, model_server.waited
    # with no retries, the same answers are failures, counted by kind
    model_server.refused.clear()
    none = write_spec(
        tmp_path, "none.yaml", task_type="http", task={**task, "retries": 0, "allow_failures": 4}
    )
    ok = orbit_json(env, "submit", str(none))["id"]
    assert "20/20 done, 4 failed" in orbit(env, "logs", ok, "--follow").stdout
    failed = [r for r in responses(env, ok, tmp_path / "none") if r["error"]]
    assert sorted(r["error"] for r in failed) == ["http 429", "http 429", "http 503", "http 503"]


def test_a_cancel_stops_sending_at_once(model_server: ModelServer, tmp_path: Path) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    task = {
        "url": f"{model_server.url}/v1/slow",
        "jsonl_file": batch(tmp_path, 200).name,
        "concurrency": 2,
    }
    run_id = orbit_json(env, "submit", str(write_spec(tmp_path, task_type="http", task=task)))["id"]
    eventually(lambda: model_server.served >= 4, 30)
    orbit(env, "cancel", run_id)
    stopped = model_server.served
    time.sleep(1.5)  # at 2 at a time, 0.3 s each: ~10 more had it gone on
    assert model_server.served <= stopped + 2  # at most those in flight at the cancel
    assert orbit_json(env, "status", run_id)["attempts"][-1]["state"] == "terminated"


@pytest.mark.parametrize(
    ("task", "says"),
    [
        ({"url": "http://10.0.0.7:8000/v1"}, "task.url: the model server must run on the node"),
        ({"url": "ftp://127.0.0.1/x"}, "task.url: expected http://HOST:PORT/PATH"),
        (
            {"url": "http://127.0.0.1:1/v1", "json": {}, "jsonl_file": "prompts.jsonl"},
            "give json (one request) or jsonl_file (a batch), not both",
        ),
        (
            {"url": "http://127.0.0.1:1/v1", "headers": {"Authorization": "Bearer x"}},
            "task.headers: Authorization would be frozen into the bundle",
        ),
        ({"url": "http://127.0.0.1:1/v1", "save": "../x.jsonl"}, "task.save: a file path"),
        ({"url": "http://127.0.0.1:1/v1", "jsonl_file": "none.jsonl"}, "task.jsonl_file: no such"),
        ({"url": "http://127.0.0.1:1/v1", "jsonl_file": "bad.jsonl"}, "line 2 is not JSON"),
        ({"url": "http://127.0.0.1:1/v1", "concurrency": 0}, "task.concurrency"),
    ],
)
def test_bad_requests_are_refused_in_one_line_and_nothing_is_frozen(
    tmp_path: Path, task: dict[str, Any], says: str
) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    batch(tmp_path, 2)
    (tmp_path / "bad.jsonl").write_text('{"i": 0}\n{"i": 1\n')
    spec = write_spec(tmp_path, task_type="http", task=task)
    refused = orbit(env, "submit", str(spec), check=False)
    assert refused.returncode == 2, refused
    assert says in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert "Traceback" not in refused.stderr
    assert not list((tmp_path / "home").rglob("job.json"))


def test_a_thousand_requests_through_an_agent_node_eight_at_a_time(
    model_server: ModelServer,
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    agent = start_agent(orbit_server, "sampler", max_tasks=1)
    wait_online(orbit_server, "sampler")
    env = orbit_server.env()
    spec = write_spec(
        tmp_path,
        task_type="http",
        template="pool",
        task={
            "url": f"{model_server.url}/v1/echo",
            "jsonl_file": batch(tmp_path, 1000).name,
            "concurrency": 8,
        },
    )
    run_id = orbit_json(env, "submit", str(spec))["id"]
    followed = orbit(env, "logs", run_id, "--follow", check=False, timeout=180)
    assert followed.returncode == 0, (followed.stderr, agent.output()[-2000:])
    assert "1000/1000 done, 0 failed" in followed.stdout
    got = responses(env, run_id, tmp_path / "out")
    assert sorted(r["index"] for r in got) == list(range(1000))
    assert model_server.most == 8 and model_server.served == 1000


def test_a_service_asked_for_by_name_is_placed_on_the_node_that_advertises_it(
    model_server: ModelServer,
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    start_agent(orbit_server, "plain", max_tasks=4)
    start_agent(
        orbit_server, "sampler", max_tasks=4, extra=["--service", f"echo={model_server.url}/v1"]
    )
    wait_online(orbit_server, "plain", "sampler")
    env = orbit_server.env()
    task = {"service": "echo", "path": "/echo", "jsonl_file": batch(tmp_path, 20).name}
    runs = [
        orbit_json(env, "submit", str(write_spec(tmp_path, f"s{i}.yaml", task_type="http",
                                                 template="pool", task=task)))["id"]
        for i in range(3)
    ]  # fmt: skip
    for run_id in runs:
        assert orbit(env, "logs", run_id, "--follow", timeout=120).returncode == 0
        assert orbit_json(env, "status", run_id)["attempts"][-1]["handle"]["target"] == "sampler"
    assert model_server.served == 60
    # asked of a service no node has: refused at submit; asked where no node advertises any
    none = write_spec(tmp_path, "none.yaml", task_type="http", template="pool",
                      task={**task, "service": "sdxl"})  # fmt: skip
    refused = orbit(env, "submit", str(none), check=False)
    assert refused.returncode == 2 and refused.stderr == (
        "orbit: error: task.service: no registered node advertises sdxl (a node does with "
        "`orbit agent --service sdxl=URL`) (--queue-anyway queues it for nodes yet to join)\n"
    )
    local = write_spec(tmp_path, "local.yaml", task_type="http", task=task)
    refused = orbit(env, "submit", str(local), check=False)
    assert refused.returncode == 2
    assert "task.service: only agent-pool nodes advertise model servers" in refused.stderr
    # the same for swift's GRPO asking for its rollout server by name: the refusal names the
    # field it was asked by
    grpo = {
        "mode": "rlhf",
        "rlhf_type": "grpo",
        "model": "Qwen/Qwen2.5-0.5B",
        "dataset": ["d"],
        "args": {"reward_funcs": ["format"], "num_generations": 2,
                 "per_device_train_batch_size": 2},
        "vllm": {"mode": "server", "service": "rollout"},
    }  # fmt: skip
    swift = write_spec(tmp_path, "grpo.yaml", task_type="swift", template="pool", task=grpo)
    refused = orbit(env, "submit", str(swift), check=False)
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "orbit: error: task.vllm.service: no registered node advertises rollout"
    ), refused.stderr

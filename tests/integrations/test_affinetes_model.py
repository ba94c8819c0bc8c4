"""`task_type: affinetes` against a real OpenAI-compatible model server: ms-swift's own
`swift deploy` (transformers backend, CPU) serving examples/swift-sft's tiny random Qwen2. The
upstream-shaped environment's evaluate() asks it for a chat completion per task; what the
server answered comes back unmodified in artifacts/raw/results.jsonl."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import orbit, orbit_json, sqlite_env
from tests.integrations.test_affinetes import attempt_dir, git, spec

pytestmark = pytest.mark.swift

ROOT = Path(__file__).resolve().parents[2]
SWIFT = ROOT / ".venv-swift" / "bin" / "swift"
PYTHON = ROOT / ".venv-swift" / "bin" / "python"

CHAT = """
import asyncio
import json
import urllib.request


class ChatActor:
    async def evaluate(self, model, base_url, task_id):
        body = {"model": model, "max_tokens": 8,
                "messages": [{"role": "user", "content": f"task {task_id}: say hello"}]}

        def post():
            request = urllib.request.Request(
                base_url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                return json.load(answer)

        answer = await asyncio.get_running_loop().run_in_executor(None, post)
        ended = answer["choices"][0]["finish_reason"] in ("stop", "length")
        return {"task_id": task_id, "score": 1.0 if ended else 0.0, "completion": answer}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`swift deploy` of the tiny model on a free loopback port: its /v1 URL."""
    if not SWIFT.exists():
        if os.environ.get("ORBIT_REQUIRE_SWIFT") == "1":
            pytest.fail(
                "ORBIT_REQUIRE_SWIFT=1 but .venv-swift has no swift: run tools/swift-venv.sh"
            )
        pytest.skip("no .venv-swift (tools/swift-venv.sh makes it)")
    folder = tmp_path_factory.mktemp("served")
    make = ROOT / "examples" / "swift-sft" / "make_model.py"
    subprocess.run([str(PYTHON), str(make), str(folder / "model")], check=True, capture_output=True)
    port = free_port()
    log = (folder / "deploy.log").open("wb")
    argv = [str(SWIFT), "deploy", "--model", str(folder / "model"), "--model_type", "qwen2"]
    argv += ["--template", "qwen2_5", "--infer_backend", "transformers", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served_model_name", "tiny", "--max_new_tokens", "8"]
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as answer:
                    if json.load(answer)["data"]:
                        break
            except OSError:
                pass
            assert server.poll() is None, (folder / "deploy.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "swift deploy did not answer within 180 s"
            time.sleep(1)
        yield url
    finally:
        # `swift deploy` runs the server as a child of its own: the whole group goes (the
        # child alone outlived the suite, 600 MB, when only `swift` was terminated)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # what of the group is left
        log.close()


def test_an_environment_scores_a_model_served_by_a_real_openai_compatible_server(
    model_server: str, tmp_path: Path
) -> None:
    repo = tmp_path / "affinetes"
    (repo / "environments" / "CHAT").mkdir(parents=True)
    (repo / "environments" / "CHAT" / "env.py").write_text(CHAT)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "chat")
    pinned = (repo, git(repo, "rev-parse", "HEAD"))
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    task = {
        "environment": "CHAT",
        "tasks": {"range": [0, 4]},
        "model": "tiny",
        "endpoint": {"base_url": model_server},
        "evaluate_args": {},
        "timeout_s": 120,
    }
    run = orbit_json(env, "submit", str(spec(tmp_path, pinned, **task)))
    followed = orbit(env, "logs", run["id"], "--follow", check=False)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "4 tasks done, mean score 1" in followed.stdout
    artifacts = attempt_dir(env, run["id"]) / "artifacts"
    results = [
        json.loads(line) for line in (artifacts / "raw" / "results.jsonl").read_text().splitlines()
    ]
    assert sorted(r["task_id"] for r in results) == [0, 1, 2, 3]
    for record in results:  # the server's own answer, as it gave it
        completion = record["result"]["completion"]
        assert completion["object"] == "chat.completion" and completion["id"].startswith(
            "chatcmpl-"
        )
        assert 0 < completion["usage"]["completion_tokens"] <= 8
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["counts"]["ok"] == 4 and manifest["score"]["mean"] == 1.0
    assert manifest["endpoint"]["url"] == model_server and manifest["model"] == "tiny"

"""`orbit inspect` and `orbit diff` over what real runs left behind: the service's evidence, the
pure functions, and the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from orbit.core.control.service import CoreControlService
from orbit.forensics.diagnose import Inspection, LayerReport, Verdict, inspect_run
from orbit.forensics.rundiff import MASK, diff_runs, facts
from orbit.model.models import FailureReason, RetryPolicy, RunState
from tests.helpers import eventually, group_alive
from tests.runtime.test_precheck import (
    attempt_dir,
    host_has_gpu,
    make_venv,
    site_packages,
    submit,
    wait_all,
)

ORBIT = [sys.executable, "-m", "orbit"]

# What the task does depends on its first argument; it always logs ms-swift style progress.
TASK_PY = """\
import json, os, pathlib, sys, time
mode = sys.argv[1]
art = pathlib.Path(os.environ["ORBIT_ARTIFACTS_DIR"])
losses = [2.0, 1.6, float("nan"), float("nan")] if mode == "nan" else [2.0, 1.5, 1.1, 0.7]
with open(art / "logging.jsonl", "w") as f:
    for step, loss in enumerate(losses, 1):
        f.write(json.dumps({"loss": loss, "global_step/max_steps": f"{step}/4"}) + "\\n")
if mode == "marker":
    pathlib.Path(sys.argv[2]).write_text("ran")
if mode == "exit3":
    print("boom", flush=True)
    sys.exit(3)
if mode == "hang":
    print("ready", flush=True)
    time.sleep(60)
"""


def task(python: Path, *args: str, **fields: Any) -> dict[str, Any]:
    return {"script": "proj/task.py", "args": list(args), "interpreter": str(python), **fields}


def write_project(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "task.py").write_text(TASK_PY)


def layers(found: Inspection) -> dict[str, LayerReport]:
    return {report.layer: report for report in found.layers}


def verdicts(found: Inspection) -> dict[str, Verdict]:
    return {report.layer: report.verdict for report in found.layers}


def orbit_cli(orbit_home: Path, store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORBIT_HOME": str(orbit_home), "ORBIT_DATABASE_URL": store_url}
    env["COLUMNS"] = "300"
    proc = subprocess.run([*ORBIT, *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


# --- inspect -----------------------------------------------------------------------------------


def test_inspect_names_the_first_layer_that_went_wrong(
    service: CoreControlService, store_url: str, orbit_home: Path, tmp_path: Path
) -> None:
    python = make_venv(tmp_path / "venv")
    write_project(tmp_path)
    marker = tmp_path / "ran"
    submitted = [
        submit(service, tmp_path, "python", task(python, "ok")),
        submit(
            service,
            tmp_path,
            "python",
            task(python, "marker", str(marker), critical_imports=["nowhere_pkg"]),
        ),
        submit(service, tmp_path, "python", task(python, "exit3")),
        submit(service, tmp_path, "python", task(python, "nan")),
    ]
    ok, missing, exit3, nan = wait_all(service, submitted)

    # a run that went well: no layer failed, and the loss went down
    assert ok.state is RunState.SUCCEEDED
    found = inspect_run(service.evidence(ok.id))
    assert (found.run_id, found.attempt, found.state) == (ok.id, 1, RunState.SUCCEEDED)
    assert found.first_wrong is None
    assert [r.layer for r in found.layers] == [
        "runtime",
        "precheck",
        "training",
        "progress",
        "nvml",
    ]
    by_layer = layers(found)
    assert by_layer["runtime"].verdict is Verdict.OK
    assert by_layer["precheck"].verdict is Verdict.OK
    assert by_layer["training"].verdict is Verdict.OK
    assert by_layer["progress"].verdict is Verdict.OK
    assert by_layer["progress"].summary == "4 logged steps, loss 2 -> 0.7"
    if not host_has_gpu():
        assert by_layer["nvml"].verdict is Verdict.ABSENT  # no GPU here, and the run went on
    # an NVML audit whose GPU sat idle the whole time is worth a look, not a failure
    audit = attempt_dir(ok) / "artifacts" / "nvml-audit.jsonl"
    audit.write_text(
        "".join(
            json.dumps({"ts": f"t{i}", "index": 0, "name": "GPU", "util_gpu": 0, "mem_used_mib": 9})
            + "\n"
            for i in range(3)
        )
    )
    found = inspect_run(service.evidence(ok.id))
    nvml = layers(found)["nvml"]
    assert nvml.verdict is Verdict.WARNING
    assert nvml.summary == "GPU 0 stayed at 0% utilization"
    assert nvml.details == ("gpu 0: 3 samples, mean util 0%, peak memory 9 MiB",)
    assert found.first_wrong is None

    # a declared dependency is missing: the precheck layer, and the task never ran
    assert missing.current.reason is FailureReason.DEPENDENCY_MISSING
    assert not marker.exists()
    found = inspect_run(service.evidence(missing.id))
    assert found.first_wrong is not None and found.first_wrong.layer == "precheck"
    assert found.first_wrong.summary.startswith("missing nowhere_pkg: ModuleNotFoundError")
    assert verdicts(found)["runtime"] is Verdict.OK
    assert verdicts(found)["progress"] is Verdict.ABSENT

    # the task's own exit: the training layer, with the log's tail
    assert exit3.current.exit_code == 3
    found = inspect_run(service.evidence(exit3.id))
    assert found.first_wrong is not None and found.first_wrong.layer == "training"
    assert found.first_wrong.summary == "the task failed (exit 3)"
    assert "boom" in found.first_wrong.details
    assert verdicts(found)["precheck"] is Verdict.OK

    # exit 0, but the loss became NaN: the progress layer, naming the ms-swift step
    assert nan.state is RunState.SUCCEEDED
    found = inspect_run(service.evidence(nan.id))
    assert found.first_wrong is not None and found.first_wrong.layer == "progress"
    assert found.first_wrong.summary == "loss became NaN/inf (first at step 3)"
    assert verdicts(found)["training"] is Verdict.OK

    # the CLI prints the same as JSON, with the first layer that went wrong
    shown = json.loads(orbit_cli(orbit_home, store_url, "inspect", missing.id, "--json").stdout)
    assert shown["first_wrong"] == "precheck"
    assert shown["run_id"] == missing.id and shown["state"] == "failed"
    assert [(r["layer"], r["verdict"]) for r in shown["layers"]][:2] == [
        ("runtime", "ok"),
        ("precheck", "failed"),
    ]
    shown = json.loads(orbit_cli(orbit_home, store_url, "inspect", ok.id, "--json").stdout)
    assert shown["first_wrong"] is None
    assert {r["layer"]: r["verdict"] for r in shown["layers"]}["nvml"] == "warning"


def test_inspect_a_wrapper_killed_mid_run_is_a_runtime_failure(
    service: CoreControlService, tmp_path: Path
) -> None:
    python = make_venv(tmp_path / "venv")
    write_project(tmp_path)
    run = submit(
        service, tmp_path, "python", task(python, "hang"), retry=RetryPolicy(max_retries=0)
    )
    training = attempt_dir(run) / "artifacts" / "training.log"
    eventually(lambda: training.exists() and "ready" in training.read_text())
    runtime = attempt_dir(run) / "runtime"
    task_pid = eventually(lambda: json.loads((runtime / "status.json").read_text()).get("task_pid"))
    # the precheck (nothing to gate here) records beside the task: killed before it wrote its
    # record, the wrapper would take it along (inspect then says precheck "absent", truly)
    eventually(lambda: (runtime / "precheck.json").exists())
    os.kill(int((runtime / "pid").read_text()), signal.SIGKILL)
    (run,) = wait_all(service, [run])
    assert run.state is RunState.FAILED and len(run.attempts) == 1
    assert run.current.reason is FailureReason.RUNTIME_LOST
    eventually(lambda: not group_alive(task_pid), timeout=5)

    found = inspect_run(service.evidence(run.id))
    assert found.first_wrong is not None and found.first_wrong.layer == "runtime"
    assert found.first_wrong.summary.startswith("runtime_lost: ")
    assert verdicts(found)["precheck"] is Verdict.OK
    assert verdicts(found)["training"] is Verdict.ABSENT  # the task did not end on its own


# --- diff --------------------------------------------------------------------------------------


def test_diff_reports_each_difference(
    service: CoreControlService, store_url: str, orbit_home: Path, tmp_path: Path
) -> None:
    python_a = make_venv(tmp_path / "venv-a", {"orbitdep": "1.0.0"})
    python_b = make_venv(tmp_path / "venv-b", {"orbitdep": "2.0.0"})
    write_project(tmp_path)

    def request(python: Path, lr: str, mode: str) -> dict[str, Any]:
        return task(python, "ok", "--lr", lr, env={"MODE": mode}, critical_imports=["orbitdep"])

    a = submit(service, tmp_path, "python", request(python_a, "0.1", "fast"))
    same = submit(service, tmp_path, "python", request(python_a, "0.1", "fast"))
    b = submit(service, tmp_path, "python", request(python_b, "0.2", "slow"))
    a, same, b = wait_all(service, [a, same, b])
    assert {r.state for r in (a, same, b)} == {RunState.SUCCEEDED}
    ev_a, ev_same, ev_b = (service.evidence(r.id) for r in (a, same, b))

    differences = diff_runs(ev_a, ev_b)
    found = {d.key: (d.a, d.b) for d in differences}
    assert found["task.request.args"] == ("['ok', '--lr', '0.1']", "['ok', '--lr', '0.2']")
    assert found["task.request.interpreter"] == (str(python_a), str(python_b))
    assert found["env.MODE"] == ("fast", "slow")
    dep_a = os.path.realpath(site_packages(tmp_path / "venv-a") / "orbitdep" / "__init__.py")
    dep_b = os.path.realpath(site_packages(tmp_path / "venv-b") / "orbitdep" / "__init__.py")
    assert found["deps.orbitdep"] == (f"1.0.0 @ {dep_a}", f"2.0.0 @ {dep_b}")
    assert found["packages.orbitdep"] == ("1.0.0", "2.0.0")
    assert found["python.executable"] == (str(python_a), str(python_b))
    assert found["bundle.digest"] == (a.bundle_digest, b.bundle_digest)
    assert "host.hostname" not in found and "python.version" not in found

    # identical submissions: nothing differs (host, python, packages are all the same here)
    assert diff_runs(ev_a, ev_same) == []

    proc = orbit_cli(orbit_home, store_url, "diff", a.id, b.id, "--json")
    shown = json.loads(proc.stdout)
    assert (shown["a"], shown["b"]) == (a.id, b.id)
    assert shown["differences"] == [d.model_dump() for d in differences]
    proc = orbit_cli(orbit_home, store_url, "diff", a.id, same.id, "--json")
    assert json.loads(proc.stdout)["differences"] == []


def test_diff_reports_a_differing_secret_without_ever_showing_it(
    service: CoreControlService, store_url: str, orbit_home: Path, tmp_path: Path
) -> None:
    """ORBIT now refuses secret-looking env at submit; a bundle frozen before that (or a task
    plugin with a secret-looking request field) still carries values that diff must mask."""
    python = make_venv(tmp_path / "venv")
    write_project(tmp_path)
    runs = [submit(service, tmp_path, "python", task(python, "ok")) for _ in range(3)]
    a, same, b = wait_all(service, runs)
    secret_a, secret_b = "hf_secretvalueAAAA1111", "hf_secretvalueBBBB2222"
    for run, secret in ((a, secret_a), (same, secret_a), (b, secret_b)):
        job_json = attempt_dir(run) / "job.json"  # what evidence reads, before the cache
        job = json.loads(job_json.read_text())
        job["env"]["HF_TOKEN"] = secret
        job["task_request"]["env"] = {"HF_TOKEN": secret}
        job["task_request"]["hub_token"] = secret
        job_json.write_text(json.dumps(job))
    ev_a, ev_same, ev_b = (service.evidence(r.id) for r in (a, same, b))

    differences = diff_runs(ev_a, ev_b)
    masked = (f"{MASK} (differs)", f"{MASK} (differs)")
    assert {d.key: (d.a, d.b) for d in differences} == {
        "env.HF_TOKEN": masked,
        "task.request.env.HF_TOKEN": masked,
        "task.request.hub_token": masked,
    }
    assert facts(ev_a)["env.HF_TOKEN"] == MASK
    assert diff_runs(ev_a, ev_same) == []  # the same secret: nothing to report
    in_python = json.dumps([d.model_dump() for d in differences]) + json.dumps(facts(ev_b))
    assert secret_a not in in_python and secret_b not in in_python

    for args in (("--json",), ()):
        proc = orbit_cli(orbit_home, store_url, "diff", a.id, b.id, *args)
        output = proc.stdout + proc.stderr
        assert "HF_TOKEN" in output and f"{MASK} (differs)" in output
        assert secret_a not in output and secret_b not in output

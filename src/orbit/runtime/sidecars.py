"""What the runtime wrapper runs beside the task: the precheck in the task's own interpreter
and the NVML audit. It travels inside the bundle beside the wrapper (scripts/orbit_sidecars.py)
and needs nothing but python3's standard library; each function takes the wrapper (`w`) whose
attempt it serves."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

PRECHECK_MISSING = 10  # the exit statuses of orbit_precheck.py
PRECHECK_MISMATCH = 11


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def too_long(program: str, exc: OSError) -> dict[str, Any]:
    """The failure fields of an exec the system refused for the size of its arguments and
    environment (E2BIG): infrastructure, since the host's own environment takes part."""
    return {
        "reason": "launch_failed",
        "message": f"cannot start {program!r}: its arguments and environment, with this "
        f"host's, are over the system's limit ({exc.strerror})",
    }


def precheck(
    w: Any, job: dict[str, Any], env: dict[str, str], workdir: str
) -> dict[str, Any] | None:
    """Run scripts/orbit_precheck.py in the task's interpreter as the wrapper `w`'s child (so
    that a stop interrupts it); the failure fields, if any."""
    spec = job.get("precheck", {})
    interpreter = spec.get("interpreter", "python3")
    script = os.path.join(w.bundle, "scripts", "orbit_precheck.py")
    if not os.path.exists(script):
        return None
    w.log(f"precheck with {interpreter}" + (" in the image" if w.docker else ""))
    # the task's own folder comes first on its path (python puts a script's folder there)
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [workdir, env.get("PYTHONPATH")])))
    argv = [interpreter, script, "--bundle", w.bundle]
    if w.docker is not None:
        argv = w.docker.precheck_argv()  # in the container, with the image's interpreter
    try:
        # in its own group, held as the child, so that a stop interrupts it too
        proc = w.child = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        _, stderr = proc.communicate(timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        w.signal_task(signal.SIGKILL)
        message = f"precheck could not run {interpreter!r}: {exc}"
        w.log(message)
        with open(os.path.join(w.artifacts, "runtime-precheck.log"), "a") as f:
            f.write(message + "\n")
        if isinstance(exc, OSError) and exc.errno == errno.E2BIG:
            return too_long(argv[0], exc)  # the task could not start either
        if spec.get("critical_imports"):
            return {"reason": "dependency_missing", "message": message}
        return None
    finally:
        code, w.child = (w.child.returncode if w.child else None), None
    if w.stop_at is not None:
        return None  # stopped while prechecking: the caller ends the attempt as terminated
    critical = bool(spec.get("critical_imports"))
    verdict = w.docker.precheck_verdict(code, stderr, critical) if w.docker else None
    if verdict is not None:  # docker's own exit codes, not the precheck's
        w.log(verdict["log"])
        with open(os.path.join(w.artifacts, "runtime-precheck.log"), "a") as f:
            f.write(verdict["log"] + "\n")
        return verdict["failure"]  # type: ignore[no-any-return]
    report = read_json(os.path.join(w.runtime, "precheck.json")) or {}
    if code == 0:
        w.log("precheck passed")
        return None
    missing = [i["name"] for i in report.get("critical_imports", []) if not i.get("ok")]
    forks = [f.get("error", "") for f in report.get("forks", []) if not f.get("ok")]
    if code == PRECHECK_MISSING:
        message = "missing dependencies: " + ", ".join(missing)
        reason = "dependency_missing"
    elif code == PRECHECK_MISMATCH:
        message = "; ".join(forks) or "a dependency is not the one declared"
        reason = "dependency_mismatch"
    else:
        message = f"precheck crashed (exit {code}): {stderr.strip()[-300:]}"
        reason = "runtime_lost"
    w.log(f"precheck failed: {message} (see artifacts/runtime-precheck.log)")
    return {"reason": reason, "message": message}


def start_audit(w: Any) -> None:
    """The NVML sidecar: one line per GPU per second into artifacts/nvml-audit.jsonl,
    from before the task starts until after it ends. Its failure never fails the run."""
    script = os.path.join(w.bundle, "scripts", "orbit_nvml.py")
    if not os.path.exists(script):
        return
    out = os.path.join(w.artifacts, "nvml-audit.jsonl")
    try:
        w.audit = subprocess.Popen(
            [sys.executable, script, "--out", out],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(w.runtime, "nvml-audit.err"), "ab"),  # noqa: SIM115
        )
    except OSError as exc:
        w.log(f"the NVML audit did not start: {exc}")
        return
    # "started before the task": wait for its first line (or its end), a few seconds at most
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and w.audit.poll() is None:
        if os.path.exists(out) and os.path.getsize(out) > 0:
            break
        time.sleep(0.01)


def stop_audit(w: Any) -> None:
    if w.audit is None:
        return
    if w.audit.poll() is None:
        w.audit.terminate()
        try:
            w.audit.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.audit.kill()
            w.audit.wait()
    w.audit = None

"""What the runtime wrapper runs beside the task: the precheck in the task's own interpreter
and the NVML audit. It travels inside the bundle beside the wrapper (scripts/orbit_sidecars.py)
and needs nothing but python3's standard library; each function takes the wrapper (`w`) whose
attempt it serves."""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

# Where a host with NVIDIA's driver shows it: the kernel module's folder, its control device,
# WSL's GPU device. NVML needs one of them.
NVIDIA_DRIVER = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")
NO_DRIVER = "no NVIDIA driver on this host (none of " + ", ".join(NVIDIA_DRIVER) + ")"
PRECHECK_MISSING = 10  # the exit statuses of orbit_precheck.py
PRECHECK_MISMATCH = 11


def nofollow(path: str, flags: int) -> int:
    """open()'s opener for what the wrapper writes in runtime/ and artifacts/: never through a
    link left there (a container's root may write both): the write fails instead of landing
    where the link points, on the host, as the wrapper's user."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


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


def precheck_gates(job: dict[str, Any], inputs: str) -> bool:
    """Whether the precheck can fail the run: declared critical imports, or a staged fork
    (inputs/**/FORK_MANIFEST.json) whose loading it must prove. Without either it only
    records, and it runs beside the task instead of before it (`precheck_beside`)."""
    if job.get("precheck", {}).get("critical_imports"):
        return True
    for _root, dirs, files in os.walk(inputs):
        if "FORK_MANIFEST.json" in files:
            return True
        dirs[:] = [d for d in dirs if d not in {".git", "__pycache__", ".orbit"}]
    return False


def _start_precheck(
    w: Any, job: dict[str, Any], env: dict[str, str], workdir: str
) -> subprocess.Popen[str] | dict[str, Any] | None:
    """scripts/orbit_precheck.py started in the task's interpreter, in its own process group;
    None without the script, the failure fields where it cannot start."""
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
        return subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        message = f"precheck could not run {interpreter!r}: {exc}"
        w.log(message)
        with open(os.path.join(w.artifacts, "runtime-precheck.log"), "a", opener=nofollow) as f:
            f.write(message + "\n")
        if exc.errno == errno.E2BIG:
            return too_long(argv[0], exc)  # the task could not start either
        if spec.get("critical_imports"):
            return {"reason": "dependency_missing", "message": message}
        return {}


def precheck(
    w: Any, job: dict[str, Any], env: dict[str, str], workdir: str
) -> dict[str, Any] | None:
    """Run the precheck before the task, as the wrapper `w`'s child (so that a stop
    interrupts it); the failure fields, if any."""
    started = _start_precheck(w, job, env, workdir)
    if not isinstance(started, subprocess.Popen):
        return started or None
    w.child = started
    try:
        _, stderr = started.communicate(timeout=600)
    except subprocess.SubprocessError as exc:
        w.signal_task(signal.SIGKILL)
        message = f"precheck did not end: {exc}"
        w.log(message)
        if job.get("precheck", {}).get("critical_imports"):
            return {"reason": "dependency_missing", "message": message}
        return None
    finally:
        code, w.child = started.returncode, None
    if w.stop_at is not None:
        return None  # stopped while prechecking: the caller ends the attempt as terminated
    critical = bool(job.get("precheck", {}).get("critical_imports"))
    verdict = w.docker.precheck_verdict(code, stderr, critical) if w.docker else None
    if verdict is not None:  # docker's own exit codes, not the precheck's
        w.log(verdict["log"])
        with open(os.path.join(w.artifacts, "runtime-precheck.log"), "a", opener=nofollow) as f:
            f.write(verdict["log"] + "\n")
        return verdict["failure"]  # type: ignore[no-any-return]
    return _verdict(w, code, stderr)


def _verdict(w: Any, code: int, stderr: str) -> dict[str, Any] | None:
    if code == 0:
        w.log("precheck passed")
        return None
    report = read_json(os.path.join(w.runtime, "precheck.json")) or {}
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


def precheck_beside(w: Any, job: dict[str, Any], env: dict[str, str], workdir: str) -> None:
    """A precheck with nothing to gate (`precheck_gates`), started just after the task, beside
    it (the interpreter and packages it records are the ones the task started with).
    `end_precheck` collects it before the attempt's files are sealed."""
    started = _start_precheck(w, job, env, workdir)
    if isinstance(started, subprocess.Popen):
        w.beside = started


def end_precheck(w: Any) -> None:
    """The precheck that ran beside the task: waited for (a minute at most; at once killed
    when the attempt is being stopped), its verdict logged. It records, so it never fails
    the run."""
    proc, w.beside = w.beside, None
    if proc is None:
        return
    try:
        _, stderr = proc.communicate(timeout=0.5 if w.stop_at is not None else 60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        w.log("precheck stopped before it ended: the attempt ended first")
        return
    if proc.returncode < 0:
        w.log(f"precheck killed by signal {-proc.returncode}")
    elif _verdict(w, proc.returncode, stderr) is not None:
        w.log("the run goes on: this precheck had nothing to gate (no critical imports, forks)")


def start_audit(w: Any) -> None:
    """The NVML sidecar: one line per GPU per second into artifacts/nvml-audit.jsonl,
    from before the task starts until after it ends. Its failure never fails the run. It
    starts beside the precheck; `audit_ready` waits for its first line before the task.

    It is a fork of the wrapper rather than a fresh interpreter: its first line, which the
    task waits for, then costs an import of pynvml and NVML's start, not a Python start-up
    and the standard library's imports over again (~30-70 ms of every attempt's start)."""
    script = os.path.join(w.bundle, "scripts", "orbit_nvml.py")
    if not os.path.exists(script):
        return
    out = os.path.join(w.artifacts, "nvml-audit.jsonl")
    if not any(os.path.exists(p) for p in NVIDIA_DRIVER):
        # NVML cannot answer on this host: the audit's one line, without its start (~20-50 ms
        # of every attempt's start and a pynvml import, on a node of a CPU partition)
        with open(out, "a", encoding="utf-8", opener=nofollow) as f:
            f.write(json.dumps({"ts": _now(), "nvml": "unavailable", "reason": NO_DRIVER}) + "\n")
        return
    try:
        err = nofollow(
            os.path.join(w.runtime, "nvml-audit.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )
        try:
            pid = os.fork()
            if pid == 0:
                _audit_child(script, out, err)  # never returns
        finally:
            os.close(err)
    except OSError as exc:
        w.log(f"the NVML audit did not start: {exc}")
        return
    w.audit = Forked(pid)


def _audit_child(script: str, out: str, err: int) -> None:
    """In the forked audit: the wrapper's signal handlers and open files (its runtime/lock
    above all: a lock held by the audit would keep a dead wrapper alive) are let go, as
    exec would, then scripts/orbit_nvml.py runs as if started with --out OUT."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(err, 2)
        _close_fds_from(3)
        scripts = os.path.dirname(script)
        if scripts not in sys.path:
            sys.path.insert(0, scripts)  # its vendored pynvml.py
        import importlib.util

        spec = importlib.util.spec_from_file_location("orbit_nvml", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        code = module.run(out, 1.0, None)
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


def _close_fds_from(low: int) -> None:
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(low, 4096)
        return
    for fd in fds:
        if fd >= low:
            with contextlib.suppress(OSError):
                os.close(fd)


class Forked:
    """The forked audit, with what the wrapper asks of a subprocess.Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0  # reaped elsewhere
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"audit {self.pid}", timeout or 0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def audit_ready(w: Any) -> None:
    """ "Started before the task": wait for the audit's first line (or its end), a few
    seconds at most."""
    out = os.path.join(w.artifacts, "nvml-audit.jsonl")
    deadline = time.monotonic() + 5
    while w.audit is not None and time.monotonic() < deadline and w.audit.poll() is None:
        if os.path.exists(out) and os.path.getsize(out) > 0:
            break
        time.sleep(0.005)


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

#!/usr/bin/env python3
"""ORBIT runtime wrapper: runs one attempt of a bundle and writes what a post-mortem needs.

It travels inside the bundle (scripts/orbit_wrapper.py) and needs nothing but python3's
standard library. Files it writes:

  runtime/pid           its own pid (liveness is proven by the lock, not the pid)
  runtime/lock          held with flock for as long as it lives: a free lock means it is gone
  runtime/status.json   the attempt's state at every transition
  runtime/result.json   exit code or signal, start and finish times, host
  runtime/runtime.log   its own steps
  artifacts/training.log   the task's stdout and stderr
  artifacts/manifest.json  path, size and sha256 of every artifact

SIGTERM (or SIGINT, SIGHUP) asks for a graceful stop: the task's process group gets SIGTERM,
then SIGKILL after the job's stop_grace_s. runtime/stop_request.json, if present, says why.

Nothing of an ended attempt keeps running: when the task ends (success, failure, stop), every
process still carrying the attempt's marker in its environment (ORBIT_ATTEMPT_ID, inherited by
whatever the task starts, also what left its process group: setsid, tensorboard, `vllm
serve`) gets SIGTERM, then SIGKILL after the grace period, before the manifest and result are
written.

With a docker launch mode (job.json's launch_mode.kind), the task and the precheck run in a
container through scripts/docker_run.sh, a stop is scripts/docker_stop.sh, and the image that
ran is recorded in runtime/image.json: see scripts/orbit_docker.py.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

try:  # in a bundle: beside this file in scripts/ (the bundle's own copy, whatever is installed)
    import orbit_sidecars as sidecars  # type: ignore[import-not-found]
except ImportError:  # as part of the orbit package
    from orbit.runtime import sidecars

MARKER = "ORBIT_ATTEMPT_ID"  # in the environment of everything an attempt starts
LAUNCHER_PID = 0  # the process that detached this wrapper (it may still be printing our pid)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# where the system tells a child's exit without reaping it (Linux), the task is reaped only
# after its group has been killed; elsewhere (macOS) on the spot, and its group killed after
REAPS_AFTER_KILL = hasattr(os, "waitid")


def exited(child: subprocess.Popen[Any]) -> bool:
    """Whether the child has exited, without reaping it where the system can tell."""
    if not REAPS_AFTER_KILL:
        return child.poll() is not None
    try:
        return os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


class Wrapper:
    def __init__(self, bundle: str) -> None:
        self.bundle = os.path.abspath(bundle)
        self.runtime = os.path.join(self.bundle, "runtime")
        self.artifacts = os.path.join(self.bundle, "artifacts")
        self.inputs = os.path.join(self.bundle, "inputs")
        self.host = os.uname().nodename  # socket.gethostname(), without importing socket
        self.child: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None
        self.stop_at: float | None = None
        self.killed = False
        self.started_at: str | None = None
        self.grace = 10.0
        self.signal_reason = "cancelled"
        self.audit: sidecars.Forked | None = None
        self.beside: subprocess.Popen[str] | None = None  # a precheck with nothing to gate
        self.docker: Any = None  # orbit_docker.DockerLaunch, for a docker launch mode
        os.makedirs(self.runtime, exist_ok=True)
        os.makedirs(self.artifacts, exist_ok=True)

    def log(self, message: str) -> None:
        with open(os.path.join(self.runtime, "runtime.log"), "a", encoding="utf-8") as f:
            f.write(f"{now()} {message}\n")

    def status(self, state: str, **extra: Any) -> None:
        data = {"state": state, "updated_at": now(), "host": self.host, "wrapper_pid": os.getpid()}
        data.update(extra)
        write_json(os.path.join(self.runtime, "status.json"), data)
        self.log(f"state -> {state}" + (f" ({extra['reason']})" if "reason" in extra else ""))

    def take_lock(self) -> Any:
        lock = open(os.path.join(self.runtime, "lock"), "a+")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"orbit wrapper: {self.bundle} is already running (runtime/lock is held)")
        # A rerun in the same folder: the last attempt's result must not speak for this one,
        # nor the stop that ended it (without a result, a stop request is for this run)
        try:
            os.unlink(os.path.join(self.runtime, "result.json"))
        except FileNotFoundError:
            pass
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.runtime, "stop_request.json"))
        with open(os.path.join(self.runtime, "pid"), "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        return lock

    def resume(self, env: dict[str, str]) -> None:
        """An attempt that goes on from an earlier one's checkpoint: the node staged it
        (ORBIT_RESUME_STAGED); it moves under this attempt's artifacts, and the task finds
        it in ORBIT_RESUME_FROM (README: "Preemption and resume")."""
        staged = env.pop("ORBIT_RESUME_STAGED", "")
        relpath = env.pop("ORBIT_RESUME_RELPATH", "")
        if not staged or not relpath or not os.path.exists(staged):
            return
        target = os.path.join(self.artifacts, relpath)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(staged, target)
        env["ORBIT_RESUME_FROM"] = target
        self.log(f"resuming from {relpath} (ORBIT_RESUME_FROM)")

    def on_stop_signal(self, signum: int, _frame: Any) -> None:
        if self.stop_at is not None:
            return
        margin = self.docker.stop_margin_s if self.docker is not None else 0.0
        self.stop_at = time.monotonic() + self.grace + margin  # docker stop kills at the grace
        # INT and HUP are a person at (or closing) a terminal; a TERM that ORBIT did not explain
        # in runtime/stop_request.json is the machine going away: spot preemption, shutdown.
        self.signal_reason = "preempted" if signum == signal.SIGTERM else "cancelled"
        self.log(f"received {signal.Signals(signum).name}: stopping the task (grace {self.grace}s)")
        self.signal_task(signal.SIGTERM)

    def signal_task(self, sig: int) -> None:
        if self.docker is not None:  # the task is a container: docker stops it, not a signal
            if sig != signal.SIGKILL:
                self.docker.stop()
                return
            self.docker.kill()
        if self.child is None or (self.child.returncode is not None and REAPS_AFTER_KILL):
            return  # reaped: its pid, the group's id, may be another's now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, sig)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_stop_signal)
        lock = self.take_lock()
        try:
            return self._run()
        except Exception as exc:  # the wrapper's own failure: an infrastructure reason
            self.log(f"wrapper error: {type(exc).__name__}: {exc}")
            self.signal_task(signal.SIGKILL)
            self.finish("failed", reason="runtime_lost", message=f"wrapper error: {exc}")
            return 1
        finally:
            lock.close()

    def _run(self) -> int:
        self.log(
            f"wrapper started on {self.host}: python {sys.version.split()[0]}, bundle {self.bundle}"
        )
        with open(os.path.join(self.bundle, "job.json"), encoding="utf-8") as f:
            job = json.load(f)
        self.grace = float(job.get("stop_grace_s", 10.0))
        self.status("starting")
        if self.stop_asked():
            # a stop asked before this wrapper was there to take it (a cancel during a
            # launch, a rank of a run across nodes started after its peers were stopped)
            self.log("a stop was asked before the task started: not starting it")
            return self.finish("terminated", reason=self.stop_reason())
        workdir = os.path.join(self.inputs, job.get("workdir", "workdir"))
        env = dict(os.environ)
        env.update(job.get("env", {}))
        env.update(
            ORBIT_RUN_ID=os.environ.get("ORBIT_RUN_ID", "manual"),
            ORBIT_ATTEMPT_ID=os.environ.get("ORBIT_ATTEMPT_ID", "manual"),
            ORBIT_BUNDLE_DIR=self.bundle,
            ORBIT_INPUTS_DIR=self.inputs,
            ORBIT_ARTIFACTS_DIR=self.artifacts,
        )
        self.resume(env)
        argv = [str(a) for a in job["entrypoint"]]
        self.started_at = now()
        if (job.get("launch_mode") or {}).get("kind") == "docker":
            self.docker = load_docker(self.bundle).DockerLaunch(self.bundle, job, env, self.log)
            failure = self.docker.prepare()  # the image, before anything runs in it
            if failure is not None:
                return self.finish("failed", **failure)
            if self.stop_at is not None:  # stopped while the image was being pulled
                return self.finish("terminated", reason=self.stop_reason())
        sidecars.start_audit(self)  # beside the precheck: its start-up overlaps the precheck's
        gates = self.docker is not None or sidecars.precheck_gates(job, self.inputs)
        if gates:
            failure = sidecars.precheck(self, job, env, workdir)
            if failure is not None:
                return self.finish("failed", **failure)
        if self.stop_at is not None:
            return self.finish("terminated", reason=self.stop_reason())
        if self.docker is not None:
            argv = self.docker.task_argv()  # the entrypoint, inside the container
        sidecars.audit_ready(self)
        self.log(f"starting task in {workdir}: {argv!r}")
        with open(os.path.join(self.artifacts, "training.log"), "ab") as out:
            try:
                self.child = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                out.write(f"orbit: cannot start {argv[0]!r}: {exc}\n".encode())
                self.log(f"cannot start the task: {exc}")
                if exc.errno == errno.E2BIG:  # this host's limit, not the task's doing
                    return self.finish("failed", **sidecars.too_long(argv[0], exc))
                return self.finish(
                    "failed",
                    reason="task_exit_nonzero",
                    exit_code=127,
                    message=f"cannot start {argv[0]!r}: {exc.strerror}",
                )
        if not gates:  # only a record: taken beside the task, which need not wait for it
            sidecars.precheck_beside(self, job, env, workdir)
        if self.stop_at is not None:  # a stop that came while the task was being started
            self.signal_task(signal.SIGTERM)
        container = {"container": self.docker.name} if self.docker is not None else {}
        self.status("running", task_pid=self.child.pid, started_at=self.started_at, **container)
        self.wait()
        self.signal_task(signal.SIGKILL)  # nothing of the task outlives it
        code = self.child.wait()  # reaped only now: until then its pid names no one else's group
        ended = self.docker.outcome(code) if self.docker is not None else None
        self.log(f"task exited with {code}")
        if self.stop_at is None and code != 0 and self.stop_asked():
            # the stop reached the task before this wrapper: a signal to the whole process
            # tree (Slurm's to a job step, a kill of the group) is not delivered in order
            self.log("a stop was asked (runtime/stop_request.json): the task ended by it")
            self.stop_at = time.monotonic()
        if self.stop_at is not None:
            return self.finish("terminated", reason=self.stop_reason(), **self.exit_fields(code))
        if ended is not None:  # docker's own failure, or the kernel's OOM kill
            return self.finish("failed", **ended)
        if code == 0:
            return self.finish("succeeded", exit_code=0)
        reason = "task_exit_nonzero" if code > 0 else "task_killed"
        return self.finish("failed", reason=reason, **self.exit_fields(code))

    def wait(self) -> None:
        """Until the task has exited, left unreaped (a zombie keeps its pid, so the group's id
        cannot pass to another process before the group is killed)."""
        assert self.child is not None
        delay, checked = 0.0005, time.monotonic()
        while not exited(self.child):
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            if time.monotonic() - checked < 0.2:
                continue
            checked = time.monotonic()
            if self.docker is not None and self.stop_at is not None and not self.killed:
                self.docker.poll_stop()
            if self.stop_at is not None and not self.killed and checked >= self.stop_at:
                self.log("grace period over: killing the task")
                self.signal_task(signal.SIGKILL)
                self.killed = True

    @staticmethod
    def exit_fields(code: int) -> dict[str, Any]:
        return {"exit_code": code} if code >= 0 else {"signal": -code}

    def stop_asked(self) -> bool:
        """Whether ORBIT has asked this attempt to stop (a rerun's old request is gone: see
        take_lock)."""
        return os.path.exists(os.path.join(self.runtime, "stop_request.json"))

    def stop_reason(self) -> str:
        request = sidecars.read_json(os.path.join(self.runtime, "stop_request.json")) or {}
        return str(request.get("reason", self.signal_reason))

    def finish(self, state: str, **fields: Any) -> int:
        if self.docker is not None:
            self.docker.finish()  # whatever happened, no container of the attempt is left
        sidecars.end_precheck(self)
        sidecars.stop_audit(self)
        self.stop_leftovers()  # before the manifest: nothing writes into artifacts/ after it
        try:
            self.write_manifest()
        except OSError as exc:
            self.log(f"cannot write the artifact manifest: {exc}")
        result = {
            "state": state,
            "host": self.host,
            "started_at": self.started_at,
            "finished_at": now(),
            **fields,
        }
        write_json(os.path.join(self.runtime, "result.json"), result)
        self.status(state, **{k: v for k, v in fields.items() if k != "state"})
        return 0 if state == "succeeded" else 1

    def stop_leftovers(self) -> None:
        """SIGTERM, then after the grace period SIGKILL, every process that still carries this
        attempt's marker: what the task started outside its process group. An attempt run by
        hand is "manual", like every other run by hand, so its bundle must match too."""
        marks = [f"{MARKER}={os.environ.get(MARKER, 'manual')}"]
        if MARKER not in os.environ:
            marks.append(f"ORBIT_BUNDLE_DIR={self.bundle}")
        if int(os.environ.get("ORBIT_NUM_NODES") or 1) > 1:  # a rank of a run across nodes:
            # its own processes, not its peers' where two ranks share a host
            marks.append(f"ORBIT_NODE_RANK={os.environ.get('ORBIT_NODE_RANK', '0')}")
        import orbit_hostside  # type: ignore[import-not-found]  # beside this file in scripts/

        keep = {LAUNCHER_PID, *orbit_hostside.ourselves()}
        try:
            stopped = orbit_hostside.stop_processes(
                lambda: orbit_hostside.marked(marks, keep), self.grace
            )
        except OSError as exc:  # no /proc (not Linux): the process group was all there was
            self.log(f"cannot look for leftover processes: {exc}")
            return
        if stopped:
            self.log(
                f"stopped {len(stopped)} leftover process(es) of the attempt that had left the "
                f"task's process group: {', '.join(map(str, stopped))}"
            )

    def write_manifest(self) -> None:
        import hashlib  # here: not in the way of every attempt's start

        files = []
        for root, dirs, names in os.walk(self.artifacts):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.artifacts).replace(os.sep, "/")
                if rel == "manifest.json" or os.path.islink(path) or not os.path.isfile(path):
                    continue
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
                files.append(
                    {"path": rel, "size": os.path.getsize(path), "sha256": digest.hexdigest()}
                )
        write_json(
            os.path.join(self.artifacts, "manifest.json"), {"schema_version": 1, "files": files}
        )


def load_docker(bundle: str) -> Any:
    """scripts/orbit_docker.py, which bundles with a docker launch mode carry: imported only
    then, so that a host-process run needs nothing but this file."""
    scripts = os.path.join(bundle, "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import orbit_docker  # type: ignore[import-not-found]

    return orbit_docker


def detach(bundle: str) -> None:
    """Double fork into a new session, so the attempt outlives the shell, the SSH connection or
    the CLI that started it. The first process returns once the wrapper has written its pid."""
    runtime = os.path.join(os.path.abspath(bundle), "runtime")
    pid_file = os.path.join(runtime, "pid")
    os.makedirs(runtime, exist_ok=True)
    # A wrapper that already runs keeps its pid file (a cancel needs it): refuse at once.
    with open(os.path.join(runtime, "lock"), "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"orbit wrapper: {bundle} is already running (runtime/lock is held)")
        if os.path.exists(pid_file):
            os.unlink(pid_file)
    global LAUNCHER_PID
    LAUNCHER_PID = os.getpid()
    first = os.fork()
    if first > 0:
        os.waitpid(first, 0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(pid_file, encoding="utf-8") as f:
                    pid = f.read().strip()
                if pid:
                    print(pid)
                    sys.exit(0)
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        sys.exit("orbit wrapper: the detached wrapper did not start (see runtime/wrapper.err)")
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    err = os.open(
        os.path.join(runtime, "wrapper.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
    )
    os.dup2(devnull, 0)
    os.dup2(err, 1)
    os.dup2(err, 2)


def parse_args(argv: list[str]) -> tuple[str, bool] | None:
    """`--bundle PATH` and `--detach`, read by hand: argparse, and the re and gettext it
    imports, cost ~10 ms of every attempt's start. None for anything else (argparse reads
    it then: abbreviations, --help, errors)."""
    bundle, detach, rest = None, False, list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--detach":
            detach = True
        elif arg == "--bundle" and rest:
            bundle = rest.pop(0)
        elif arg.startswith("--bundle="):
            bundle = arg.split("=", 1)[1]
        else:
            return None
    return (bundle or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), detach)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args is None:
        import argparse

        parser = argparse.ArgumentParser(description="Run one attempt of an ORBIT bundle.")
        parser.add_argument(
            "--bundle", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        )
        parser.add_argument("--detach", action="store_true", help="go on in the background")
        parsed = parser.parse_args(argv)  # exits on what it cannot read
        args = (parsed.bundle, parsed.detach)
    bundle, detached = args
    if detached:
        detach(bundle)
    return Wrapper(bundle).run()


if __name__ == "__main__":
    sys.exit(main())

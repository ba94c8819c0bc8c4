#!/usr/bin/env python3
"""ORBIT runtime wrapper: runs one attempt of a bundle and writes what a post-mortem needs.

It travels inside the bundle (scripts/orbit_wrapper.py) and needs nothing but python3's
standard library. Files it writes:

  runtime/pid           its own pid (liveness is proven by the lock, not the pid)
  runtime/lock          held with flock for as long as it lives: a free lock means it is gone
  runtime/status.json   the attempt's state at every transition
  runtime/result.json   exit code or signal, start and finish times, host
  runtime/last_run.json    the bundle's last run on its own: run, attempt, bundle digest,
                        template, where (handle facts), pids, start and end, exit, reason
  runtime/runtime.log   its own steps
  runtime/training.times   when training.log reached which size (for `orbit logs --since`)
  artifacts/training.log   the task's stdout and stderr
  artifacts/manifest.json  path, size and sha256 of every artifact

SIGTERM (or SIGINT, SIGHUP) asks for a graceful stop, and nothing of an ended attempt keeps
running: see scripts/orbit_stopping.py. Beside it in scripts/ too: orbit_detach.py (its command
line, and --detach), orbit_records.py (how it writes the files above), orbit_sidecars.py (the
precheck and the NVML audit), orbit_host_processes.py (the processes of an attempt).

With a docker launch mode (job.json's launch_mode.kind), the task and the precheck run in a
container through scripts/docker_run.sh, a stop is scripts/docker_stop.sh, and the image that
ran is recorded in runtime/image.json: see scripts/orbit_docker.py.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # as mypy reads them
    from orbit.runtime import detach, records, sidecars, stopping
else:
    try:  # in a bundle: beside this file in scripts/ (the bundle's own copy, whatever is installed)
        import orbit_detach as detach
        import orbit_records as records
        import orbit_sidecars as sidecars
        import orbit_stopping as stopping
    except ImportError:  # as part of the orbit package
        from orbit.runtime import detach, records, sidecars, stopping


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
    def __init__(
        self, bundle: str, launcher_pid: int = 0, secrets: dict[str, str] | None = None
    ) -> None:
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
        self.fence_checked = 0.0  # when the agent's contact was last looked at
        self.launcher_pid = launcher_pid  # what detached it (it may still be printing our pid)
        # the run's secrets (scripts/orbit_secret_env.py): the task's environment, and masked
        # out of everything written here
        self.secrets = secrets or {}
        self.masked = None
        if secrets:
            self.masked = detach.load_script("orbit_secret_env", bundle).Masked(secrets)
        self.last_run: dict[str, Any] = {
            "schema_version": 1,
            **records.provenance(),
            "handle": records.handle_facts(self.bundle, self.host),
            "wrapper_pid": os.getpid(),
        }
        self.times = records.LogTimes(
            os.path.join(self.artifacts, "training.log"),
            os.path.join(self.bundle, records.TIMES_RELPATH),
        )
        os.makedirs(self.runtime, exist_ok=True)
        os.makedirs(self.artifacts, exist_ok=True)

    def log(self, message: str) -> None:
        if self.masked is not None:
            message = self.masked.text(message)
        path = os.path.join(self.runtime, "runtime.log")
        with open(path, "a", encoding="utf-8", opener=sidecars.nofollow) as f:
            f.write(f"{records.now()} {message}\n")

    def status(self, state: str, **extra: Any) -> None:
        data = {
            "state": state,
            "updated_at": records.now(),
            "host": self.host,
            "wrapper_pid": os.getpid(),
        }
        data.update(extra)
        records.write_json(os.path.join(self.runtime, "status.json"), data)
        self.log(f"state -> {state}" + (f" ({extra['reason']})" if "reason" in extra else ""))

    def write_last_run(self, **fields: Any) -> None:
        """runtime/last_run.json, so that the bundle on its own tells its last run."""
        self.last_run.update(fields, started_at=self.started_at)
        try:
            records.write_json(os.path.join(self.runtime, "last_run.json"), self.last_run)
        except OSError as exc:  # a record for people: never what ends the attempt
            self.log(f"cannot write runtime/last_run.json: {exc}")

    def take_lock(self) -> Any:
        path = os.path.join(self.runtime, "lock")
        lock = open(path, "a+", opener=sidecars.nofollow)  # noqa: SIM115 - held until exit
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
        path = os.path.join(self.runtime, "pid")
        with open(path, "w", encoding="utf-8", opener=sidecars.nofollow) as f:
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
            signal.signal(sig, lambda signum, frame: stopping.on_signal(self, signum, frame))
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
        if stopping.asked(self):
            # a stop asked before this wrapper was there to take it (a cancel during a
            # launch, a rank of a run across nodes started after its peers were stopped)
            self.log("a stop was asked before the task started: not starting it")
            return self.finish("terminated", reason=stopping.reason(self))
        workdir = os.path.join(self.inputs, job.get("workdir", "workdir"))
        env = dict(os.environ)
        env.update(job.get("env", {}))
        env.update(self.secrets)
        if self.secrets:  # their names (never values): what ORBIT's launchers mask
            env["ORBIT_SECRET_NAMES"] = ",".join(sorted(self.secrets))
        env.update(
            ORBIT_RUN_ID=os.environ.get("ORBIT_RUN_ID", "manual"),
            ORBIT_ATTEMPT_ID=os.environ.get("ORBIT_ATTEMPT_ID", "manual"),
            ORBIT_BUNDLE_DIR=self.bundle,
            ORBIT_INPUTS_DIR=self.inputs,
            ORBIT_ARTIFACTS_DIR=self.artifacts,
        )
        self.resume(env)
        argv = [str(a) for a in job["entrypoint"]]
        self.started_at = records.now()
        if (job.get("launch_mode") or {}).get("kind") == "docker":
            docker = detach.load_script("orbit_docker", self.bundle)
            self.docker = docker.DockerLaunch(self.bundle, job, env, self.log)
            failure = self.docker.prepare()  # the image, before anything runs in it
            if failure is not None:
                return self.finish("failed", **failure)
            if self.stop_at is not None:  # stopped while the image was being pulled
                return self.finish("terminated", reason=stopping.reason(self))
        sidecars.start_audit(self)  # beside the precheck: its start-up overlaps the precheck's
        gates = self.docker is not None or sidecars.precheck_gates(job, self.inputs)
        if gates:
            failure = sidecars.precheck(self, job, env, workdir)
            if failure is not None:
                return self.finish("failed", **failure)
        if self.stop_at is not None:
            return self.finish("terminated", reason=stopping.reason(self))
        silent = stopping.agent_gone()
        if silent is not None:  # its agent was cut off while it got here: given up on
            self.log(f"its agent has had no word from the control plane for {silent:.0f}s")
            return self.finish("terminated", reason="node_lost")
        if self.docker is not None:
            argv = self.docker.task_argv()  # the entrypoint, inside the container
        sidecars.audit_ready(self)
        self.log(f"starting task in {workdir}: {argv!r}")
        log_path = os.path.join(self.artifacts, "training.log")
        with open(log_path, "ab", opener=sidecars.nofollow) as out:
            # with secrets, the output goes through a pipe and is masked on its way
            read_end, sink = os.pipe() if self.masked is not None else (-1, out.fileno())
            try:
                self.child = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                if read_end >= 0:
                    os.close(read_end)
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
            finally:
                if read_end >= 0:
                    os.close(sink)  # the task holds it now
        if self.masked is not None:
            self.masked.start_pump(read_end, log_path, sidecars.nofollow)
        if not gates:  # only a record: taken beside the task, which need not wait for it
            sidecars.precheck_beside(self, job, env, workdir)
        if self.stop_at is not None:  # a stop that came while the task was being started
            self.signal_task(signal.SIGTERM)
        container = {"container": self.docker.name} if self.docker is not None else {}
        self.status("running", task_pid=self.child.pid, started_at=self.started_at, **container)
        # the task leads a session of its own: its process group's id is its pid
        self.write_last_run(
            state="running", task_pid=self.child.pid, task_pgid=self.child.pid, **container
        )
        self.wait()
        self.signal_task(signal.SIGKILL)  # nothing of the task outlives it
        self.end_output()
        self.times.mark(force=True)
        code = self.child.wait()  # reaped only now: until then its pid names no one else's group
        ended = self.docker.outcome(code) if self.docker is not None else None
        self.log(f"task exited with {code}")
        if self.stop_at is None and code != 0 and stopping.asked(self):
            # the stop reached the task before this wrapper: a signal to the whole process
            # tree (Slurm's to a job step, a kill of the group) is not delivered in order
            self.log("a stop was asked (runtime/stop_request.json): the task ended by it")
            self.stop_at = time.monotonic()
        if self.stop_at is not None:
            return self.finish("terminated", reason=stopping.reason(self), **self.exit_fields(code))
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
            self.times.mark()
            if self.stop_at is None and checked >= self.fence_checked + 1.0:
                self.fence_checked = checked
                stopping.fence(self)
            if self.docker is not None and self.stop_at is not None and not self.killed:
                self.docker.poll_stop()
            if self.stop_at is not None and not self.killed and checked >= self.stop_at:
                self.log("grace period over: killing the task")
                self.signal_task(signal.SIGKILL)
                self.killed = True

    @staticmethod
    def exit_fields(code: int) -> dict[str, Any]:
        return {"exit_code": code} if code >= 0 else {"signal": -code}

    def end_output(self) -> None:
        """With secrets: the last of the task's output through the masking pipe."""
        if self.masked is not None and not self.masked.end_pump():
            self.log("the task's output is still held open by a process it left")

    def finish(self, state: str, **fields: Any) -> int:
        if self.docker is not None:
            self.docker.finish()  # whatever happened, no container of the attempt is left
        sidecars.end_precheck(self)
        sidecars.stop_audit(self)
        stopping.stop_leftovers(
            self
        )  # before the manifest: nothing writes into artifacts/ after it
        if self.masked is not None:
            self.end_output()  # what a leftover held open ends with its stop
            for path in (
                os.path.join(self.artifacts, "runtime-precheck.log"),
                os.path.join(self.runtime, "precheck.json"),
                os.path.join(self.runtime, "wrapper.err"),
            ):
                self.masked.file(path)
            fields = self.masked.fields(fields)
        try:
            records.write_manifest(self.artifacts)
        except OSError as exc:
            self.log(f"cannot write the artifact manifest: {exc}")
        result = {
            "state": state,
            "host": self.host,
            "started_at": self.started_at,
            "finished_at": records.now(),
            **fields,
        }
        records.write_json(os.path.join(self.runtime, "result.json"), result)
        self.write_last_run(**result)
        self.status(state, **{k: v for k, v in fields.items() if k != "state"})
        return 0 if state == "succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    args = detach.parse_args(sys.argv[1:] if argv is None else argv)
    if args is None:
        import argparse

        parser = argparse.ArgumentParser(description="Run one attempt of an ORBIT bundle.")
        parser.add_argument(
            "--bundle", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        )
        parser.add_argument("--detach", action="store_true", help="go on in the background")
        parser.add_argument(
            "--secrets", help="the run's secrets, a JSON object: - for stdin, or a file to delete"
        )
        parsed = parser.parse_args(argv)  # exits on what it cannot read
        args = (parsed.bundle, parsed.detach, parsed.secrets)
    bundle, detached, source = args
    secrets = detach.read_secrets(bundle, source)
    launcher = detach.detach(bundle) if detached else 0
    return Wrapper(bundle, launcher, secrets).run()


if __name__ == "__main__":
    sys.exit(main())

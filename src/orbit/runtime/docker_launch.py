"""ORBIT docker launch, the runtime wrapper's side (standard library only).

Travels as scripts/orbit_docker.py in bundles whose launch mode is docker, next to the
generated scripts/docker_run.sh and scripts/docker_stop.sh that it calls. The wrapper itself
stays on the host, outside the container, so status, logs, the NVML audit and result files are
written exactly as for a host process, whatever the image holds. This module adds what only a
container needs:

  - before anything runs: the image is found (pulled if the launch mode says so) and what it
    is, id and digests, lands in runtime/image.json; the container then runs that exact id,
    so a tag moved in the meantime cannot change what ran. No image: `image_not_found`.
  - a stop (cancel, preemption) is `docker stop` with the job's grace period, then removal;
    the task's process is the attached `docker run` client, which a signal would not stop.
  - at the end, whatever the outcome, every container of the attempt is removed.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

DOCKER_RUN_FAILED = 125  # `docker run`'s own failure: the container did not start
CANNOT_EXEC = (126, 127)  # the command is not in the image, or cannot be run
PULL_TIMEOUT_S = 3600.0
# `docker rm` of a container that a stop (or `--rm`) is removing already: nothing to do
GONE = ("No such container", "already in progress")
RESTOP_AFTER_S = 3.0  # a stop that found no container yet (it was being created) is repeated


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def docker_endpoint(env: Mapping[str, str]) -> str:
    """Where the Docker CLI will go, in words: the standard DOCKER_HOST, else its default.
    (The control plane's orbit.core.execution.docker.host says it with this same function.)"""
    if env.get("DOCKER_HOST"):
        return f"DOCKER_HOST={env['DOCKER_HOST']}"
    if env.get("DOCKER_CONTEXT"):
        return f"DOCKER_CONTEXT={env['DOCKER_CONTEXT']}"
    return "the default Docker socket (unix:///var/run/docker.sock; set DOCKER_HOST for another)"


def last_line(text: str) -> str:
    """The line of docker's output that says what went wrong (not its `--help` hint)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("Run '")]
    for line in reversed(lines):
        if "docker:" in line or "Error" in line:
            return line[-500:]
    return lines[-1][-500:] if lines else ""


class DockerLaunch:
    def __init__(
        self,
        bundle: str,
        job: dict[str, Any],
        env: dict[str, str],
        log: Callable[[str], None],
    ) -> None:
        mode = job.get("launch_mode") or {}
        self.ref = str(mode.get("image") or "")
        self.pull = str(mode.get("pull") or "missing")
        self.scripts = os.path.join(bundle, "scripts")
        self.runtime = os.path.join(bundle, "runtime")
        self.artifacts = os.path.join(bundle, "artifacts")
        self.log = log
        # `env` is the wrapper's own dict for the task: what is set here reaches the scripts
        self.env = env
        self.attempt_id = env.get("ORBIT_ATTEMPT_ID") or "manual"
        # a rank of a run across nodes has a container of its own, where ranks share a host
        self.node = env.setdefault("ORBIT_NODE", env.get("ORBIT_NODE_RANK") or "0")
        self.name = env.setdefault("ORBIT_CONTAINER", f"orbit-{self.attempt_id}-n{self.node}")
        self.in_precheck = False
        self.stopping = False  # a stop was asked for: a pull in progress gives up
        self.stopper: subprocess.Popen[str] | None = None
        self.stopped_at = 0.0
        # docker stop kills at the grace period; the wrapper's own kill waits this much more
        self.stop_margin_s = 15.0

    # --- the Docker CLI ---------------------------------------------------------------------

    def cli(self, args: list[str], timeout: float = 120.0) -> tuple[int, str, str]:
        argv = [self.env.get("DOCKER") or "docker", *args]
        try:
            proc = subprocess.run(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: command not found"
        except OSError as exc:
            return 126, "", f"{argv[0]}: {exc}"
        except subprocess.TimeoutExpired:
            return 124, "", f"docker {args[0]} did not answer within {timeout:.0f}s"
        return proc.returncode, proc.stdout, proc.stderr

    def where(self) -> str:
        return docker_endpoint(self.env)

    # --- the image --------------------------------------------------------------------------

    def inspect_image(self) -> tuple[dict[str, Any] | None, str]:
        code, out, err = self.cli(["image", "inspect", "--format", "{{json .}}", self.ref])
        if code != 0:
            return None, err.strip() or f"docker image inspect exited {code}"
        try:
            data = json.loads(out)
        except ValueError:
            return None, "docker image inspect printed no JSON"
        return (data, "") if isinstance(data, dict) else (None, "docker image inspect: no object")

    def prepare(self) -> dict[str, Any] | None:
        """Find the image, record it in runtime/image.json, and make the scripts run that exact
        id. The failure fields when it cannot be had, else None."""
        if not self.ref:
            return {"reason": "image_not_found", "message": "job.json names no launch_mode.image"}
        image, error = self.inspect_image()
        if image is None and "no such image" not in error.lower():
            return {"reason": "launch_failed", "message": f"docker at {self.where()}: {error}"}
        pulled, pull_error = False, ""
        if self.pull == "always" or (image is None and self.pull == "missing"):
            self.log(f"pulling image {self.ref} ({self.where()})")
            code, err = self.pull_image()
            if self.stopping:
                return None  # the wrapper ends the attempt as stopped
            if code == 0:
                pulled = True
                image, error = self.inspect_image()
            else:
                pull_error = last_line(err) or f"docker pull exited {code}"
                self.log(f"pull failed: {pull_error}")
        if image is None:
            message = f"image {self.ref} is not on the Docker host ({self.where()})"
            if pull_error:
                message += f" and could not be pulled: {pull_error}"
            elif self.pull == "never":
                message += " and the launch mode says pull: never"
            return {"reason": "image_not_found", "message": message}
        code, version, _ = self.cli(["version", "--format", "{{.Server.Version}}"], timeout=30)
        record = {
            "schema_version": 1,
            "ref": self.ref,  # what the job asked for
            "id": image.get("Id"),  # what ran: the container is started from this id
            "repo_digests": image.get("RepoDigests") or [],
            "repo_tags": image.get("RepoTags") or [],
            "created": image.get("Created"),
            "platform": f"{image.get('Os', '?')}/{image.get('Architecture', '?')}",
            "pull": self.pull,
            "pulled": pulled,
            "pull_error": pull_error or None,
            "docker_host": self.where(),
            "server_version": version.strip() if code == 0 else None,
            "at": now(),
        }
        write_json(os.path.join(self.runtime, "image.json"), record)
        self.log(f"image {self.ref} is {record['id']}" + (" (pulled)" if pulled else ""))
        if record["id"]:
            self.env["ORBIT_IMAGE"] = str(record["id"])
        self.kill()  # a container left by an earlier life of this attempt would block the name
        return None

    def pull_image(self) -> tuple[int, str]:
        """`docker pull`, which may take long: a stop asked for meanwhile interrupts it."""
        argv = [self.env.get("DOCKER") or "docker", "pull", "--quiet", self.ref]
        try:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as exc:
            return 127, f"{argv[0]}: {exc}"
        deadline = time.monotonic() + PULL_TIMEOUT_S
        while proc.poll() is None:
            if self.stopping or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return 124, "the pull was interrupted"
            time.sleep(0.1)
        return proc.returncode, proc.stderr.read() if proc.stderr else ""

    # --- what runs ----------------------------------------------------------------------------

    def precheck_argv(self) -> list[str]:
        self.in_precheck = True
        return ["sh", os.path.join(self.scripts, "docker_run.sh"), "--precheck"]

    def precheck_verdict(
        self, code: int | None, stderr: str, critical: bool
    ) -> dict[str, Any] | None:
        """What a precheck exit means when it ran in a container, where docker has exit codes
        of its own: {"log": line, "failure": fields or None}, or None for the usual meaning."""
        self.in_precheck = False
        if code in CANNOT_EXEC:
            line = f"the image has no interpreter to run the precheck: {last_line(stderr)}"
            if critical:
                return {"log": line, "failure": {"reason": "dependency_missing", "message": line}}
            return {"log": f"precheck skipped ({line}); nothing critical declared", "failure": None}
        if code == DOCKER_RUN_FAILED:
            line = f"docker could not start the precheck container: {last_line(stderr)}"
            return {"log": line, "failure": {"reason": "launch_failed", "message": line}}
        return None

    def task_argv(self) -> list[str]:
        self.in_precheck = False
        self.env["ORBIT_KEEP_CONTAINER"] = "1"  # its exit state is read, then it is removed
        return ["sh", os.path.join(self.scripts, "docker_run.sh")]

    def container_state(self) -> dict[str, Any] | None:
        code, out, _ = self.cli(["container", "inspect", "--format", "{{json .State}}", self.name])
        if code != 0:
            return None
        try:
            state = json.loads(out)
        except ValueError:
            return None
        return state if isinstance(state, dict) else None

    def outcome(self, code: int) -> dict[str, Any] | None:
        """What docker knows beyond the client's exit code, as failure fields (else None):
        a container that never started is docker's failure, not the task's; one the kernel
        killed for memory is `task_killed`."""
        state = self.container_state() or {}
        if state.get("OOMKilled"):
            return {
                "reason": "task_killed",
                "exit_code": code,
                "message": "the container ran out of memory (OOMKilled)",
            }
        started_at = str(state.get("StartedAt") or "")
        started = bool(started_at) and not started_at.startswith("0001-")  # Go's zero time
        if code == DOCKER_RUN_FAILED and not started:
            detail = str(state.get("Error") or "") or last_line(self.training_tail())
            return {
                "reason": "launch_failed",
                "message": f"docker could not start the container: {detail}",
            }
        return None

    def training_tail(self) -> str:
        try:
            with open(os.path.join(self.artifacts, "training.log"), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    # --- stopping ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Graceful: scripts/docker_stop.sh (docker stop with the grace period, then rm), in
        the background; the wrapper goes on waiting for the `docker run` client to return."""
        self.stopping = True
        if self.stopper is not None and self.stopper.poll() is None:
            return
        argv = ["sh", os.path.join(self.scripts, "docker_stop.sh")]
        if self.in_precheck:
            argv.append("--precheck")
        self.log(f"stopping container {self.name}{'-precheck' if self.in_precheck else ''}")
        try:
            self.stopper = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        except OSError as exc:
            self.log(f"cannot run docker_stop.sh: {exc}")
        self.stopped_at = time.monotonic()

    def poll_stop(self) -> None:
        """Called while a stopped task is still running: a stop that came while the container
        was still being created found nothing to stop, so it is repeated."""
        if self.stopper is None or self.stopper.poll() is None:
            return
        out = self.stopper.stdout.read() if self.stopper.stdout else ""
        if out.strip():
            self.log(f"docker_stop.sh: {last_line(out)}")
        self.stopper = None
        if time.monotonic() - self.stopped_at >= RESTOP_AFTER_S:
            self.stop()

    def kill(self) -> None:
        """Remove every container of this attempt on this node, running or not (found by its
        labels, so a container that is not this attempt's is never touched)."""
        code, out, err = self.cli(
            [
                "ps",
                "--all",
                "--quiet",
                "--filter",
                f"label=orbit.attempt={self.attempt_id}",
                "--filter",
                f"label=orbit.node={self.node}",
            ],
            timeout=60,
        )
        ids = out.split()
        if code != 0:
            self.log(f"cannot list this attempt's containers: {last_line(err)}")
        elif ids:
            code, _, err = self.cli(["rm", "--force", *ids], timeout=60)
            if code == 0:
                self.log(f"removed {len(ids)} container(s) of this attempt")
            elif not any(gone in err for gone in GONE):
                self.log(f"removing this attempt's containers failed: {last_line(err)}")

    def finish(self) -> None:
        """At the attempt's end, whatever it was: let a stop in progress end, then remove
        every container of the attempt."""
        if self.stopper is not None:
            try:
                self.stopper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.stopper.kill()
            self.stopper = None
        self.kill()

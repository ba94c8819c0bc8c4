"""Running Slurm's commands and ORBIT's hostside on a cluster: on this machine (a submit host)
or on its login node over the SSH transport. Holds no connection between calls."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
from typing import Any

from orbit.core.execution.ssh.transport import Ssh, SshOptions, last_line
from orbit.model.clusters import ClusterSpec
from orbit.model.errors import OrbitError, Unreachable
from orbit.model.hosts import HostSpec
from orbit.runtime import hostside

TIMEOUT_S = 60.0


class ClusterShell:
    def __init__(self, spec: ClusterSpec, options: SshOptions) -> None:
        self.spec = spec
        self.ssh = Ssh(login_spec(spec), options) if spec.ssh is not None else None

    @property
    def where(self) -> str:
        return f"cluster '{self.spec.name}'"

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.spec.slurm_conf} if self.spec.slurm_conf else {}

    def run(
        self, argv: list[str], stdin: bytes | None = None, timeout: float = TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """A command there; its exit status is the caller's to read. Raises Unreachable when
        the login node did not answer, OrbitError when the command cannot be run at all."""
        if self.ssh is not None:
            env = [f"{k}={v}" for k, v in self.env().items()]
            proc = self.ssh.run(["env", *env, *argv] if env else argv, stdin=stdin, timeout=timeout)
            return subprocess.CompletedProcess(
                proc.args,
                proc.returncode,
                proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"),
            )
        try:
            done = subprocess.run(
                argv,
                input=stdin or b"",
                capture_output=True,
                timeout=timeout,
                env={**os.environ, **self.env()},
            )
        except FileNotFoundError:
            raise OrbitError(f"{self.where}: {argv[0]} is not installed here") from None
        except subprocess.TimeoutExpired:
            raise Unreachable(f"{self.where}: {argv[0]} did not answer in {timeout:.0f}s") from None
        return subprocess.CompletedProcess(
            done.args,
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    def output(self, argv: list[str]) -> str:
        """stdout of a command that must succeed; its failure in one line otherwise."""
        done = self.run(argv)
        if done.returncode != 0:
            raise OrbitError(
                f"{self.where}: {shlex.join(argv)} failed (exit {done.returncode}: "
                f"{slurm_message(done.stderr) or 'no message'})"
            )
        return done.stdout

    def hostside(self, *args: str) -> dict[str, Any]:
        """A command of orbit/runtime/hostside.py: in process here, with python3 there."""
        if self.ssh is not None:
            return self.ssh.hostside(*args, timeout=3600)
        return hostside.main(list(args))

    def put_secrets(self, location: str, secrets: dict[str, str], ranks: int) -> None:
        """The attempt's secrets as SECRETS_DIR/rank-N.json under its folder (mode 0600), for
        each rank's wrapper to read and delete; over SSH, inside the program hostside reads."""
        if self.ssh is not None:
            found = self.ssh.hostside(
                "put-secrets", location, str(ranks), secrets=secrets, timeout=TIMEOUT_S
            )
        else:
            found = hostside.put_secrets(location, ranks, secrets)
        if "error" in found:
            raise OrbitError(f"{self.where}: {found['error']}")

    def drop_secrets(self, location: str) -> None:
        """No job will read them (sbatch refused it): put_secrets' files go, as far as the
        cluster answers."""
        with contextlib.suppress(OrbitError):
            self.run(["rm", "-rf", f"{location}/{hostside.SECRETS_DIR}"])

    def write(self, path: str, data: bytes) -> None:
        if self.ssh is None:  # a submit host: no process for it
            tmp = f"{path}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except OSError as exc:
                raise OrbitError(f"{self.where}: writing {path} failed: {exc}") from None
            return
        done = self.run(["sh", "-c", 'cat > "$1.tmp" && mv "$1.tmp" "$1"', "-", path], stdin=data)
        if done.returncode != 0:
            raise OrbitError(f"{self.where}: writing {path} failed: {last_line(done.stderr)}")


def login_spec(spec: ClusterSpec) -> HostSpec:
    """The login node as an SSH host whose work dir is the cluster's."""
    assert spec.ssh is not None
    return spec.ssh.model_copy(update={"work_dir": spec.work_dir, "python": spec.python})


def slurm_message(stderr: str) -> str:
    """Slurm's own one-line reason, e.g. `Invalid account or account/partition combination
    specified` out of `sbatch: error: Batch job submission failed: ...`."""
    line = last_line(stderr)
    for prefix in ("sbatch: error: ", "Batch job submission failed: ", "error: "):
        if line.startswith(prefix):
            line = line[len(prefix) :]
    return line

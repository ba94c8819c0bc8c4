"""The SSH transport: the system OpenSSH client and rsync, with the user's ~/.ssh/config.

Connections are multiplexed (ControlMaster) so that the many short calls of a status refresh or
a `logs --follow` share one TCP connection; the master exits on its own after ControlPersist
idle seconds, and nothing of a run depends on it. Host keys are checked as the user's ssh
checks them: ORBIT never turns that off, and says what to do when a key is unknown.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from orbit.core.execution.ssh.hosts import CHECK_SCRIPT, parse_facts
from orbit.model.config import Settings
from orbit.model.errors import OrbitError, Unreachable
from orbit.model.hosts import HostFacts, HostSpec

CONTROL_PERSIST_S = 30


class SshAuthError(OrbitError):
    """The host answered but refused the key, or its host key is unknown or changed."""


@dataclass(frozen=True)
class SshOptions:
    """How this control plane talks SSH: an ssh config file instead of ~/.ssh/config (for
    tests and shared setups), and the timeout that bounds connecting and silence."""

    config_file: Path | None = None
    timeout_s: float = 15.0
    control_dir: Path | None = None

    def control_path(self) -> Path:
        # unix socket paths are short (108 bytes): a private folder under /tmp, keyed by
        # the ORBIT home it serves
        folder = self.control_dir or Path(tempfile.gettempdir()) / "orbit-ssh"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise OrbitError(
                f"{folder}: the SSH control-socket folder must be yours alone (mode 0700); "
                "remove it and try again"
            )
        return folder / "%C"


# hostside's siblings, as a bundle names them (scripts/orbit_NAME.py), each after those it imports
HOSTSIDE_SIBLINGS = ("host_files", "host_processes", "host_staging")
# `python3 -` reads one program: the siblings arrive in it as their sources, each made a module
# on its own (its `from __future__` must be its first statement) and put where hostside's
# `import orbit_NAME` finds it; hostside then runs as __main__, as if it were the script
HOSTSIDE_BOOTSTRAP = """\
import sys
import types


def sibling(name, source):
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name + ".py", "exec", dont_inherit=True), module.__dict__)


"""


@functools.cache
def _hostside_source() -> bytes:
    """orbit/runtime/hostside.py with its siblings, as the one program of `python3 -`."""
    runtime = resources.files("orbit.runtime")

    def source(name: str) -> str:
        return ascii((runtime / f"{name}.py").read_text(encoding="utf-8"))  # a literal

    program = [HOSTSIDE_BOOTSTRAP]
    program += [f"sibling('orbit_{name}', {source(name)})\n" for name in HOSTSIDE_SIBLINGS]
    program.append(
        f"exec(compile({source('hostside')}, 'orbit_hostside.py', 'exec', dont_inherit=True),"
        " {'__name__': '__main__', 'ORBIT_SECRETS': SECRETS})\n"
    )
    return "".join(program).encode("ascii")


def hostside_program(secrets: dict[str, str] | None = None) -> bytes:
    """The program `python3 -` reads: a launch's secrets come in it, as its first line, so
    they cross the SSH connection inside its stdin and never touch a command line or a disk."""
    return f"SECRETS = {secrets or None!a}\n".encode("ascii") + _hostside_source()


def classify(spec: HostSpec, stderr: str) -> OrbitError:
    """What an ssh exit status 255 means, as one line that says what to do."""
    text = " ".join(stderr.split())
    where = f"host '{spec.name}' ({spec.ssh}{f' port {spec.port}' if spec.port else ''})"
    if "Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text:
        port = f"-p {spec.port} " if spec.port else ""
        return SshAuthError(
            f"{where}: its host key is unknown or has changed, and ORBIT does not skip host key "
            f"checks. Connect once with `ssh {port}{spec.ssh}`, check the fingerprint it shows "
            "and accept it (or add it to known_hosts with ssh-keyscan and the host's address), "
            "or re-add the host with --accept-new-host-key to trust a key seen for the first time"
        )
    if "Permission denied" in text or "Too many authentication failures" in text:
        return SshAuthError(
            f"{where} refused the key ({last_line(stderr)}): check --identity, or the IdentityFile "
            "for it in your ssh config"
        )
    return Unreachable(f"{where} is unreachable: {last_line(stderr) or 'ssh failed'}")


def last_line(stderr: str) -> str:
    """The line of ssh's or rsync's stderr that says what went wrong."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith("Warning: Permanently added")]
    return (useful or lines or [""])[-1][:300]


class Ssh:
    """Commands and transfers to one host. Holds no connection of its own between calls."""

    def __init__(self, spec: HostSpec, options: SshOptions) -> None:
        self.spec = spec
        self.options = options

    def ssh_argv(self, multiplex: bool = True) -> list[str]:
        """ssh's arguments. Short calls share one connection (multiplex); a bulk transfer
        takes a connection of its own, which moves data faster than relaying it through the
        shared connection's master process."""
        timeout = max(1, int(self.options.timeout_s))
        argv = ["ssh"]
        if self.options.config_file is not None:
            argv += ["-F", str(self.options.config_file)]
        shared = {
            "ControlMaster": "auto",
            "ControlPath": str(self.options.control_path()),
            "ControlPersist": f"{CONTROL_PERSIST_S}s",
        }
        options = {
            "BatchMode": "yes",  # never a password or host-key prompt: a clear failure instead
            **(shared if multiplex else {"ControlMaster": "no", "ControlPath": "none"}),
            "ConnectTimeout": str(timeout),
            "ServerAliveInterval": str(max(1, timeout // 3)),
            "ServerAliveCountMax": "3",
        }
        if self.spec.accept_new_host_key:
            options["StrictHostKeyChecking"] = "accept-new"  # asked for by the user, by name
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        if self.spec.port is not None:
            argv += ["-p", str(self.spec.port)]
        if self.spec.identity is not None:
            argv += ["-i", str(Path(self.spec.identity).expanduser()), "-o", "IdentitiesOnly=yes"]
        if self.spec.proxy_jump is not None:
            argv += ["-J", self.spec.proxy_jump]
        return argv

    def run(
        self, argv: list[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a command on the host. Raises Unreachable (or SshAuthError) when ssh itself
        failed; the command's own exit status is the caller's to read."""
        limit = timeout if timeout is not None else self.options.timeout_s * 4 + 30
        try:
            proc = subprocess.run(
                [*self.ssh_argv(), "--", self.spec.ssh, shlex.join(argv)],
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=limit,
            )
        except subprocess.TimeoutExpired:
            raise Unreachable(
                f"host '{self.spec.name}' ({self.spec.ssh}) did not answer within {limit:.0f}s"
            ) from None
        if proc.returncode == 255:
            raise classify(self.spec, proc.stderr.decode(errors="replace"))
        return proc

    def stream(
        self, argv: list[str], sink: Callable[[bytes], object], chunk: int = 1 << 20
    ) -> tuple[int, str]:
        """Run a command on the host, its stdout going to `sink` as it arrives, nothing of it
        held here: (the command's exit status, its stderr). Raises as run() does when ssh
        itself failed, also part way (what `sink` got by then did arrive)."""
        with subprocess.Popen(
            [*self.ssh_argv(multiplex=False), "--", self.spec.ssh, shlex.join(argv)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            widen = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux: fewer, larger reads
            if widen is not None:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(proc.stdout.fileno(), widen, chunk)
            while data := os.read(proc.stdout.fileno(), chunk):  # what has arrived, at once
                sink(data)
            stderr = proc.stderr.read().decode(errors="replace")
            code = proc.wait()
        if code == 255:  # a broken connection stalls no longer than ServerAlive lets it
            raise classify(self.spec, stderr)
        return code, stderr

    def close(self) -> None:
        """Let the shared connection go as soon as no one uses it, rather than when it has
        idled out: after a launch nothing of the run keeps an SSH connection open. (`stop`, not
        `exit`: another ORBIT command using the same connection finishes what it is doing.)"""
        subprocess.run(
            [*self.ssh_argv(), "-O", "stop", "--", self.spec.ssh],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )

    def hostside(
        self, *args: str, timeout: float | None = None, secrets: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Run a command of orbit/runtime/hostside.py on the host with its python3; `secrets`
        (a launch's) inside the program it reads on stdin."""
        program = hostside_program(secrets)
        proc = self.run([self.spec.python, "-", *args], stdin=program, timeout=timeout)
        out = proc.stdout.decode(errors="replace").strip()
        if proc.returncode == 127 or (proc.returncode != 0 and not out):
            detail = last_line(proc.stderr.decode(errors="replace"))
            raise OrbitError(
                f"host '{self.spec.name}': cannot run {self.spec.python} there "
                f"(exit {proc.returncode}: {detail}); install python3 or set --python"
            )
        try:
            data = json.loads(out.splitlines()[-1])
        except (ValueError, IndexError):
            data = None
        if not isinstance(data, dict):
            raise OrbitError(f"host '{self.spec.name}': unreadable answer: {out[-200:]!r}")
        return data

    def rsync_argv(self, *extra: str) -> list[str]:
        """rsync over this host's ssh, with its options (-e); `extra` are sources and dest."""
        return [
            "rsync",
            "--archive",
            "--partial",  # an interrupted transfer keeps what arrived: the next one continues
            "--stats",
            f"--timeout={max(5, int(self.options.timeout_s * 4))}",
            "-e",
            shlex.join(self.ssh_argv()),
            *extra,
        ]

    def remote(self, path: str) -> str:
        return f"{self.spec.ssh}:{path}"


def stats_bytes(output: str, label: str) -> int:
    """A figure of rsync --stats, e.g. `Total bytes sent: 1,234`; 0 when absent."""
    match = re.search(rf"{label}: ([\d,.]+)", output)
    return int(re.sub(r"[,.]", "", match.group(1))) if match else 0


def options_for(settings: Settings) -> SshOptions:
    """The settings' SSH options, with one short control-socket folder per ORBIT home."""
    key = hashlib.sha256(str(settings.home).encode()).hexdigest()[:12]
    return SshOptions(
        config_file=settings.ssh_config,
        timeout_s=settings.ssh_timeout_s,
        control_dir=Path(tempfile.gettempdir()) / f"orbit-ssh-{key}",
    )


def probe_host(spec: HostSpec, options: SshOptions) -> HostFacts:
    """Run the check script on the host (POSIX sh: it works without python3) and parse it."""
    proc = Ssh(spec, options).run(
        ["sh", "-s", "--", spec.work_dir, spec.python], stdin=CHECK_SCRIPT.encode()
    )
    if proc.returncode != 0:
        raise OrbitError(
            f"host '{spec.name}': the check failed (exit {proc.returncode}: "
            f"{last_line(proc.stderr.decode(errors='replace'))})"
        )
    return parse_facts(proc.stdout.decode(errors="replace"), datetime.now(UTC))

"""Moving bundles and artifacts to and from an SSH host with rsync.

Staging is content-addressed: the frozen parts of a bundle go into the host's bundles/DIGEST/,
so pushing an unchanged bundle again (a retry, a replay) sends nothing, and a transfer that
breaks off is continued by the next push. Collecting is incremental and resumable, and every
file is verified against the attempt's manifest."""

from __future__ import annotations

import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orbit.core.execution.artifacts import CollectResult, sha256_file, verify_manifest
from orbit.core.execution.bundle import FROZEN_PARTS, FrozenBundle
from orbit.core.execution.ssh.transport import Ssh, last_line, stats_bytes
from orbit.model.errors import OrbitError, Unreachable
from orbit.model.models import RunHandle


def stage_bundle(ssh: Ssh, bundle: FrozenBundle) -> dict[str, Any]:
    """The bundle's frozen parts into the host's bundles/DIGEST/; nothing is sent when the
    host has it already. A transfer that breaks off is continued by the next push."""
    found = ssh.hostside("stage-check", ssh.spec.work_dir, bundle.digest)
    if "error" in found:
        raise OrbitError(f"host '{ssh.spec.name}': {found['error']}")
    work = str(found["work"])
    if found["cached"]:
        return {"work": work, "sent": 0, "wire": 0, "cached": True}
    sources = [str(bundle.path / part) for part in FROZEN_PARTS]
    dest = ssh.remote(f"{work}/{found['partial']}/")
    proc = subprocess.run(
        ssh.rsync_argv("--delete", *sources, dest), capture_output=True, text=True
    )
    if proc.returncode != 0:
        _staging_failed(ssh, bundle, work, proc)
    done = ssh.hostside("stage-commit", work, bundle.digest)
    if "error" in done:
        raise OrbitError(f"host '{ssh.spec.name}': {done['error']}")
    return {
        "work": work,
        "sent": stats_bytes(proc.stdout, "Literal data"),  # payload, not protocol
        "wire": stats_bytes(proc.stdout, "Total bytes sent"),
        "cached": False,
    }


def _staging_failed(
    ssh: Ssh, bundle: FrozenBundle, work: str, proc: subprocess.CompletedProcess[str]
) -> None:
    where, last = f"host '{ssh.spec.name}'", last_line(proc.stderr) or "no message"
    if "No space left" in proc.stderr:
        # a full disk: free what the partial transfer took rather than keep it for later
        ssh.hostside("stage-abort", work, bundle.digest)
        size = sum(f.stat().st_size for f in bundle.path.rglob("*") if f.is_file())
        raise OrbitError(
            f"{where}: no space left in {work} while staging the bundle "
            f"({size / 2**20:.0f} MiB): free space there or choose another --work-dir"
        )
    tail = [line for line in proc.stderr.splitlines() if line.strip()][-3:]
    if proc.returncode == 255 or any("connection" in line.lower() for line in tail):
        raise Unreachable(
            f"{where}: the connection broke while staging (rsync exit {proc.returncode}: "
            f"{last}); the next push continues where this one stopped"
        )
    raise OrbitError(f"{where}: staging with rsync failed (exit {proc.returncode}: {last})")


def collect_artifacts(ssh: Ssh, handle: RunHandle, dest: Path) -> CollectResult:
    """rsync artifacts/ here: incremental (files already here are skipped) and resumable
    (a file cut off is the basis of the next transfer: only what differs moves), then every
    file is verified against artifacts/manifest.json. Each file rsync reports done is
    hashed while the next ones are still on the way."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = ssh.rsync_argv(
        "--inplace",  # each file is written where it stays: hashed as soon as it is done
        "--out-format=>%b %n",  # %b: logged once the file is complete, not as it starts
        ssh.remote(f"{handle.location}/artifacts/"),
        f"{dest}/",
    )
    digests: dict[str, Future[str]] = {}
    with (
        ThreadPoolExecutor(max_workers=1) as hasher,
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc,
    ):
        assert proc.stdout is not None and proc.stderr is not None
        stats = []
        for line in proc.stdout:
            name = line.rstrip("\n").partition(" ")[2]
            if line.startswith(">") and name and not name.endswith("/"):
                digests[name] = hasher.submit(sha256_file, dest / name)
            else:
                stats.append(line)
        stderr = proc.stderr.read()
        code = proc.wait()
        if code != 0:
            raise Unreachable(
                f"collecting from host '{handle.target}' was interrupted (rsync exit "
                f"{code}: {last_line(stderr) or 'no message'}); run the same collect "
                "again: it moves only what is missing"
            )
        taken = {
            name: future.result()
            for name, future in digests.items()
            if future.exception() is None  # unreadable now: verify_manifest says why
        }
    held = [p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()]
    found, problems = verify_manifest(dest, taken)
    return CollectResult(
        dest=dest,
        files=len(held),
        bytes=sum(p.stat().st_size for p in held),
        moved=stats_bytes("".join(stats), "Literal data"),  # only what moved
        verified=found and not problems,
        problems=tuple(problems),
    )

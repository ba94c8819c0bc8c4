"""Benchmark: staging a bundle to an SSH host and collecting artifacts back, beside plain rsync.

Run from the repository root, as root (it starts a real sshd on a loopback port, with the
fixtures of tests/sshd.py):

    .venv/bin/python bench/staging.py               # 1 GiB, 3 runs each
    .venv/bin/python bench/staging.py --size-mib 128 --repeat 1   # a smoke run
    .venv/bin/python bench/staging.py --json

Three figures, each the median over --repeat runs, ORBIT and its peer alternating:

    stage    SshHostProcessBackend.stage: a bundle holding one input file of --size-mib random
             MiB into a fresh work dir on the host (rsync of the frozen parts into a partial
             folder, then its atomic commit) vs `rsync -a -e ssh` of the same input folder.
    re-push  stage() of the same, unchanged bundle again: payload bytes sent and seconds
             (goal: 0 bytes, under 1 s).
    collect  SshHostProcessBackend.collect: artifacts/ of --size-mib MiB of checkpoints (4
             files and their manifest) into a fresh folder, every file then verified against
             manifest.json, vs `rsync -a -e ssh` of the same folder.

The ratio is peer seconds / ORBIT seconds, so > 1.0 means ORBIT is faster; goal >= 0.8.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/sshd.py: the real sshd

from tests.sshd import SshdFactory

from orbit.core.execution.backends.ssh_host_process import NoHosts, SshHostProcessBackend
from orbit.core.execution.bundle import freeze_bundle
from orbit.core.execution.ssh.transfer import stage_bundle
from orbit.core.execution.ssh.transport import Ssh, SshOptions
from orbit.model.hosts import HostSpec
from orbit.model.models import JobSpec, LaunchMode, RunHandle
from orbit.model.task import StagedPath

CHUNK = 16 << 20
JOB = JobSpec(
    task_type="bench",
    template_id="bench",
    launch_mode=LaunchMode(kind="host_process"),
    entrypoint=("true",),
)


def write_random(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        while size:
            block = os.urandom(min(CHUNK, size))
            f.write(block)
            digest.update(block)
            size -= len(block)
    return digest.hexdigest()


def timed(action: Callable[[], object]) -> tuple[float, object]:
    os.sync()
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    size = args.size_mib << 20

    with tempfile.TemporaryDirectory(prefix="orbit-bench-staging-") as scratch_name:
        scratch = Path(scratch_name)
        factory = SshdFactory(scratch)
        try:
            server = factory(alias="bench-host")
            spec = HostSpec(name="bench-host", ssh=server.alias, work_dir=str(server.work_root))
            options = SshOptions(config_file=server.config, control_dir=scratch / "cm")
            backend = SshHostProcessBackend(NoHosts(), options)
            ssh = Ssh(spec, options)
            rsh = " ".join(ssh.ssh_argv())

            data = scratch / "input"
            data.mkdir()
            write_random(data / "weights.bin", size)
            bundle = freeze_bundle(JOB, [StagedPath(data, "data")], scratch / "bundles")

            stage_s, plain_stage_s = [], []
            for i in range(args.repeat):
                work = server.work_root / f"stage-{i}"
                spec_i = spec.model_copy(update={"work_dir": str(work)})
                seconds, _ = timed(lambda s=spec_i: stage_bundle(Ssh(s, options), bundle))
                stage_s.append(seconds)
                dest = f"{server.alias}:{server.work_root}/plain-{i}/"
                seconds, _ = timed(
                    lambda d=dest: subprocess.run(
                        ["rsync", "-a", "-e", rsh, f"{data}/", d], check=True
                    )
                )
                plain_stage_s.append(seconds)
            repush_s, repush = timed(
                lambda: stage_bundle(
                    Ssh(
                        spec.model_copy(update={"work_dir": str(server.work_root / "stage-0")}),
                        options,
                    ),
                    bundle,
                )
            )
            assert isinstance(repush, dict)

            # an attempt's artifacts on the host: 4 checkpoints and their manifest
            artifacts = server.work_root / "attempts" / "bench-1" / "artifacts"
            artifacts.mkdir(parents=True)
            files = []
            for n in range(4):
                name = f"ckpt/step-{n}.pt"
                (artifacts / "ckpt").mkdir(exist_ok=True)
                digest = write_random(artifacts / name, size // 4)
                files.append({"path": name, "size": size // 4, "sha256": digest})
            (artifacts / "manifest.json").write_text(json.dumps({"files": files}))
            handle = RunHandle(
                backend_key=backend.key,
                target="bench-host",
                attempt_id="bench-1",
                location=str(artifacts.parent),
                data={"host": spec.model_dump(mode="json")},
            )
            collect_s, plain_collect_s = [], []
            for i in range(args.repeat):
                dest_dir = scratch / f"collect-{i}"
                seconds, result = timed(lambda d=dest_dir: backend.collect(handle, d))
                assert getattr(result, "verified", False), result
                collect_s.append(seconds)
                plain_dir = scratch / f"plain-collect-{i}"
                seconds, _ = timed(
                    lambda p=plain_dir: subprocess.run(
                        ["rsync", "-a", "-e", rsh, f"{server.alias}:{artifacts}/", f"{p}/"],
                        check=True,
                    )
                )
                plain_collect_s.append(seconds)
                shutil.rmtree(dest_dir)
                shutil.rmtree(plain_dir)
        finally:
            factory.close()

    def summary(ours: list[float], peer: list[float]) -> dict[str, float]:
        o, p = statistics.median(ours), statistics.median(peer)
        return {"orbit_s": o, "rsync_s": p, "ratio": p / o, "orbit_MBps": size / o / 1e6}

    report = {
        "size_mib": args.size_mib,
        "repeat": args.repeat,
        "stage": summary(stage_s, plain_stage_s),
        "repush": {
            "seconds": repush_s,
            "payload_bytes": repush["sent"],
            "wire_bytes": repush["wire"],
        },
        "collect": summary(collect_s, plain_collect_s),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.size_mib} MiB, median of {args.repeat}; ratio = rsync s / orbit s (goal >= 0.8)")
    for name in ("stage", "collect"):
        r = report[name]
        assert isinstance(r, dict)
        print(
            f"  {name:<8} orbit {r['orbit_s']:6.2f} s ({r['orbit_MBps']:6.0f} MB/s)  "
            f"rsync {r['rsync_s']:6.2f} s  ratio {r['ratio']:.2f}"
        )
    print(
        f"  re-push  {repush_s * 1000:.0f} ms, {repush['sent']} payload bytes, "
        f"{repush['wire']} rsync bytes (goal: 0 bytes, < 1 s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

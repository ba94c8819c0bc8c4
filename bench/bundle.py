"""Benchmark: bundle freeze and digest, beside `tar` and `sha256sum` on the same data.

Run from the repository root:

    .venv/bin/python bench/bundle.py                 # 1 GiB file + 10,000 small files, 3 runs
    .venv/bin/python bench/bundle.py --quick         # 128 MiB + 2,000 files, for a smoke run
    .venv/bin/python bench/bundle.py --json --keep --scratch /tmp/orbit-bench

Two inputs are generated under the scratch folder (default bench/.data/, git-ignored) and
removed at the end unless --keep: one large file of random bytes, and many small files
(1-8 KiB) spread over subfolders. For each input, with a warm page cache (every operation
runs once untimed first), the median over --repeat runs of:

    digest  orbit.core.execution.bundle.compute_digest over an already frozen bundle
            vs  `find DIR -type f -print0 | xargs -0 sha256sum` over the same bundle's files
    freeze  orbit.core.execution.bundle.freeze_bundle (copy the input folder into a new bundle,
            then digest)
            vs  `tar -cf - -C SRC . | tar -xf - -C DEST` (a plain copy of the same folder)

Throughput is input bytes / seconds in MB/s (10^6 bytes) and input files / seconds; the
ratio is orbit/peer, so > 1.0 means orbit is faster. Goal: digest ratio >= 0.8.
Dirty pages are flushed (os.sync) before each timed run, so one run's writeback does not
land in the next run's time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orbit.core.execution.bundle import compute_digest, freeze_bundle
from orbit.model.models import JobSpec, LaunchMode
from orbit.model.task import StagedPath

CHUNK = 16 << 20
JOB = JobSpec(
    task_type="bench",
    template_id="bench",
    launch_mode=LaunchMode(kind="host_process"),
    entrypoint=("true",),
)


def make_large(root: Path, size_mib: int) -> None:
    root.mkdir(parents=True)
    left = size_mib << 20
    with open(root / "blob.bin", "wb") as f:
        while left:
            n = min(CHUNK, left)
            f.write(os.urandom(n))
            left -= n


def make_small(root: Path, count: int) -> None:
    rng = random.Random(1234)  # sizes and layout are reproducible; contents are random
    for i in range(count):
        folder = root / f"d{i % 50:02d}" / f"e{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}.bin").write_bytes(os.urandom(rng.randint(1024, 8192)))


def tree_size(root: Path) -> tuple[int, int]:
    """(bytes, files) of the regular files under root."""
    total = files = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            total += os.lstat(os.path.join(dirpath, name)).st_size
            files += 1
    return total, files


def shell(cmd: str) -> Callable[[], object]:
    return lambda: subprocess.run(cmd, shell=True, check=True)


def median_time(
    fn: Callable[[], object], repeat: int, cleanup: Callable[[], None] = lambda: None
) -> float:
    """Median seconds over `repeat` runs, after one untimed warm-up run."""
    fn()
    cleanup()
    times = []
    for _ in range(repeat):
        os.sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        cleanup()
    return statistics.median(times)


def bench_case(name: str, src: Path, work: Path, repeat: int) -> list[dict[str, object]]:
    nbytes, nfiles = tree_size(src)
    bundle = freeze_bundle(JOB, [StagedPath(src, "data")], work / "cache").path
    out = work / "out"

    def freeze() -> None:
        freeze_bundle(JOB, [StagedPath(src, "data")], out)

    def tar_copy() -> None:
        out.mkdir()
        shell(f"tar -cf - -C {shlex.quote(str(src))} . | tar -xf - -C {shlex.quote(str(out))}")()

    def clear() -> None:
        shutil.rmtree(out, ignore_errors=True)

    pairs = {
        "digest": (
            median_time(lambda: compute_digest(bundle), repeat),
            median_time(
                shell(
                    f"find {shlex.quote(str(bundle))} -type f -print0"
                    " | xargs -0 sha256sum >/dev/null"
                ),
                repeat,
            ),
            "sha256sum",
        ),
        "freeze": (
            median_time(freeze, repeat, clear),
            median_time(tar_copy, repeat, clear),
            "tar|tar",
        ),
    }
    rows = []
    for op, (orbit_s, peer_s, peer) in pairs.items():
        rows.append(
            {
                "case": name,
                "op": op,
                "bytes": nbytes,
                "files": nfiles,
                "orbit_s": orbit_s,
                "peer": peer,
                "peer_s": peer_s,
                "orbit_mb_s": nbytes / orbit_s / 1e6,
                "peer_mb_s": nbytes / peer_s / 1e6,
                "orbit_files_s": nfiles / orbit_s,
                "peer_files_s": nfiles / peer_s,
                "ratio": peer_s / orbit_s,
            }
        )
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    head = (
        "case",
        "op",
        "peer",
        "orbit MB/s",
        "peer MB/s",
        "orbit files/s",
        "peer files/s",
        "ratio",
    )
    lines = [head]
    for r in rows:
        many = r["files"] != 1  # files/s says nothing about a single file
        lines.append(
            (
                str(r["case"]),
                str(r["op"]),
                str(r["peer"]),
                f"{r['orbit_mb_s']:.0f}",
                f"{r['peer_mb_s']:.0f}",
                f"{r['orbit_files_s']:.0f}" if many else "-",
                f"{r['peer_files_s']:.0f}" if many else "-",
                f"{r['ratio']:.2f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print(
            "  ".join(
                cell.rjust(w) if i > 2 else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=Path, default=Path(__file__).parent / ".data")
    parser.add_argument("--size-mib", type=int, default=1024, help="large-file case size")
    parser.add_argument("--small-files", type=int, default=10_000, help="small-file case count")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per measure (median)")
    parser.add_argument("--quick", action="store_true", help="128 MiB and 2,000 files")
    parser.add_argument("--keep", action="store_true", help="leave the generated data behind")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.small_files = 128, 2_000
    for tool in ("sha256sum", "tar", "find", "xargs"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not on PATH")

    made_scratch = not args.scratch.exists()
    root = args.scratch / f"run-{os.getpid()}"
    rows: list[dict[str, object]] = []
    try:
        cases = [
            (f"large {args.size_mib} MiB", make_large, args.size_mib),
            (f"small {args.small_files} files", make_small, args.small_files),
        ]
        for i, (name, make, n) in enumerate(cases):
            src = root / f"case{i}" / "src"
            print(f"# {name}: generating data", file=sys.stderr)
            make(src, n)
            print(f"# {name}: measuring ({args.repeat} runs each)", file=sys.stderr)
            rows += bench_case(name, src, root / f"case{i}", args.repeat)
            if not args.keep:
                shutil.rmtree(root / f"case{i}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
            if made_scratch and args.scratch.is_dir() and not any(args.scratch.iterdir()):
                args.scratch.rmdir()

    if args.json:
        print(
            json.dumps({"cpus": os.cpu_count(), "repeat": args.repeat, "results": rows}, indent=2)
        )
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

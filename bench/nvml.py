"""Benchmark: the NVML audit sidecar's cost per GPU-sample (goal: < 100 us).

Run from the repository root:

    .venv/bin/python bench/nvml.py                   # 2,000 ticks in batches of 50
    .venv/bin/python bench/nvml.py --ticks 200 --json
    .venv/bin/python bench/nvml.py --replay          # force the replay, even on a GPU machine

In-process, it drives the sidecar's own sampling code (orbit.runtime.nvml_audit.Auditor)
tick after tick with no sleep between them. Against the real pynvml (nvidia-ml-py) where
nvmlInit succeeds and there is at least one GPU; otherwise, and with --replay, against the
replay fake (tests/fakes/pynvml_replay.py) serving tests/data/nvml/h100-recording.json. It
says which. Two figures, each the median over batches of the batch's time / GPU-samples:

    tick     Auditor.tick(): timestamp, XID event drain, every GPU's NVML reads, JSON line
    sample   Auditor.sample() alone: one GPU's NVML reads into a dict

The replay figure is the Python overhead of the sidecar plus the fake's dictionary lookups;
the real figure adds the NVML library and driver round trips.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from orbit.runtime.nvml_audit import Auditor

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fakes" / "pynvml_replay.py"
RECORDING = ROOT / "tests" / "data" / "nvml" / "h100-recording.json"
GOAL_US = 100.0


def replay_module(recording: Path) -> Any:
    os.environ["ORBIT_NVML_RECORDING"] = str(recording)
    os.environ.pop("ORBIT_NVML_CALL_LOG", None)
    spec = importlib.util.spec_from_file_location("pynvml_replay", FAKE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def open_auditor(force_replay: bool, recording: Path) -> tuple[Auditor, str]:
    if not force_replay:
        try:
            import pynvml

            auditor = Auditor(pynvml)
            reason = auditor.open()
            if reason is None:
                return auditor, f"real NVML (nvidia-ml-py {version('nvidia-ml-py')})"
            print(f"real NVML unavailable ({reason}): using the replay", file=sys.stderr)
        except ImportError as exc:
            print(f"pynvml not importable ({exc}): using the replay", file=sys.stderr)
    auditor = Auditor(replay_module(recording))
    reason = auditor.open()
    if reason is not None:
        raise SystemExit(f"the replay cannot open {recording}: {reason}")
    return auditor, f"replay fake ({recording.relative_to(ROOT)})"


def per_sample_us(run_batch: Any, batches: int, samples_per_batch: int) -> float:
    times = []
    for _ in range(batches):
        started = time.perf_counter_ns()
        run_batch()
        times.append((time.perf_counter_ns() - started) / 1000 / samples_per_batch)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=2000, help="timed ticks in all")
    parser.add_argument("--batch", type=int, default=50, help="ticks per timed batch")
    parser.add_argument("--replay", action="store_true", help="use the replay even with a GPU")
    parser.add_argument("--recording", type=Path, default=RECORDING)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    auditor, backend = open_auditor(args.replay, args.recording.resolve())
    try:
        gpus = len(auditor.devices)
        batches = max(1, args.ticks // args.batch)
        for _ in range(min(args.batch, 100)):  # warm up
            auditor.tick()

        def ticks() -> None:
            for _ in range(args.batch):
                auditor.tick()

        def samples() -> None:
            for _ in range(args.batch):
                for dev in auditor.devices:
                    auditor.sample(dev, "ts", {})

        tick_us = per_sample_us(ticks, batches, args.batch * gpus)
        sample_us = per_sample_us(samples, batches, args.batch * gpus)
    finally:
        auditor.close()

    result = {
        "backend": backend,
        "gpus": gpus,
        "ticks": batches * args.batch,
        "tick_us_per_gpu_sample": round(tick_us, 2),
        "sample_us_per_gpu_sample": round(sample_us, 2),
        "goal_us": GOAL_US,
        "meets_goal": tick_us < GOAL_US,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"backend: {backend}, {gpus} GPU(s), {result['ticks']} ticks")
        print(f"tick   {tick_us:8.2f} us per GPU-sample (timestamp, XID drain, reads, JSON)")
        print(f"sample {sample_us:8.2f} us per GPU-sample (NVML reads only)")
        print(f"goal   {GOAL_US:8.2f} us: {'met' if result['meets_goal'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: what a policy of 50 CEL rules costs, at a submit and replayed over a store.

Run from the repository root:

    PYTHONPATH=src .venv/bin/python bench/policy.py                 # 100,000 runs, SQLite + PG
    PYTHONPATH=src .venv/bin/python bench/policy.py --quick         # 10,000 runs, fewer samples
    PYTHONPATH=src .venv/bin/python bench/policy.py --databases sqlite --json out.json

1. admission: a generated file of 50 rules (deny and warn conditions with a match, messages
   with {{ CEL }} parts, one default, rules on the time, on the submitter's role and on a
   request's env and selector), applied to an embedded store; then --samples submissions of
   `true` on the `local` template through the control service (CoreControlService
   .submit_task: shaped, frozen, recorded and launched as `orbit submit` does), with no policy
   and with the 50 rules, p50 and p99 of each; and, beside them, the admission alone (what
   the submit path adds: the policy's version read, the request as rules read it, the 50
   rules evaluated, the stamp made) --samples * 20 times, p50 and p99.
2. replay: a store seeded as bench/api.py seeds it (--runs runs over the last 90 days), the 50
   rules applied, and `policy diff` of a candidate (the same rules with three made stricter,
   and one more that refuses the `sft` experiment's runs in working hours) over the last 100
   days: its wall time, submissions per second, and how many it would newly refuse.

Goals (the issue): the policy adds <= 2 ms p99 to a submission with 50 rules; `policy diff
--since 30d` over 100,000 recorded submissions with 50 rules completes in under 60 s. Every
figure comes from this machine in this run; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import api as seeding

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.models import TaskSubmission


def rules_file(count: int = 50, stricter: int = 0) -> str:
    """`count` rules of the kinds a site writes; the first `stricter` of the deny rules made
    stricter (a candidate)."""
    lines = ["rules:"]
    kinds = [
        ("deny", 'request.priority == "batch"', "request.resources.gpu_count > {n}",
         "batch runs take at most {n} GPUs (asked {{{{ request.resources.gpu_count }}}})"),
        ("warn", None, "request.resources.cpu_count > {n}",
         "{{{{ user.name }}}} asks {{{{ request.resources.cpu_count }}}} CPUs (over {n})"),
        ("deny", 'user.role == "member"', "request.num_nodes > {n}",
         "members run on at most {n} nodes"),
        ("warn", "now.getHours() >= 9 && now.getHours() < 18",
         "request.resources.gpu_count > {n} && request.priority != \"urgent\"",
         "more than {n} GPUs in working hours"),
        ("deny", 'experiment.startsWith("prod-")',
         '!("MODEL_REVISION" in request.env) && {n} >= 0',
         "production runs pin MODEL_REVISION"),
        ("deny", None, 'request.selector.exists(k, k == "forbidden-{n}")',
         "no run asks for the forbidden-{n} label"),
    ]  # fmt: skip
    strict = 0
    for i in range(count - 1):
        kind, match, condition, message = kinds[i % len(kinds)]
        n = 2 + i
        if kind == "deny" and strict < stricter and "gpu_count" in condition:
            n, strict = 0, strict + 1
        lines.append(f"  - name: rule-{i:02d}")
        if match:
            lines.append(f"    match: '{match}'")
        lines.append(f"    {kind}: '{condition.format(n=n)}'")
        lines.append(f"    message: '{message.format(n=n)}'")
    lines += ["  - name: cap-runtime", "    set: {max_runtime_s: 259200}"]
    return "\n".join(lines) + "\n"


def candidate() -> str:
    """The 50 rules with three made stricter, and one more that refuses the `sft` experiment's
    runs (about a fifth of the seeded ones) in working hours."""
    return rules_file(stricter=3) + (
        "  - name: no-sft-by-day\n"
        "    match: 'now.getHours() >= 9 && now.getHours() < 18'\n"
        "    deny: 'experiment == \"sft\"'\n"
        "    message: 'sft runs wait for the night'\n"
    )


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "n": len(ordered),
    }


def submission() -> TaskSubmission:
    return TaskSubmission.model_validate(
        {"experiment_id": "bench", "task_type": "command", "task_request": {"command": "true"},
         "template_id": "local", "retry": {"max_retries": 0}}
    )  # fmt: skip


def admission(samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="orbit-bench-policy-") as scratch:
        home = Path(scratch)
        settings = Settings(home=home, database_url=f"sqlite:///{home / 'orbit.db'}")
        svc = CoreControlService.from_settings(settings, actor="alice")
        try:
            submitted: dict[str, list[float]] = {"none": [], "50 rules": []}
            for label in submitted:
                if label != "none":
                    svc.apply_policy(rules_file(), "bench.yaml")
                for i in range(samples + 3):
                    started = time.perf_counter()
                    svc.submit_task(submission(), base_dir=home)
                    if i >= 3:  # the first ones warm caches up
                        submitted[label].append(time.perf_counter() - started)
            template = svc.templates.get("local")
            part = svc.parts.policy
            from orbit.model.overrides import resolve

            sub = submission()
            request = resolve(template, sub.overrides)
            alone = []
            for _ in range(samples * 20):
                started = time.perf_counter()
                part.admit(request, sub, template, "bench")
                alone.append(time.perf_counter() - started)
        finally:
            svc.close()
    return {
        "submit": {k: quantiles(v) for k, v in submitted.items()},
        "admission alone (50 rules)": quantiles(alone),
    }


def replay(kind: str, runs: int, postgres_url: str) -> dict[str, Any]:
    seed = seeding.plan_seed(runs, random.Random(7))
    seed.chain()
    with tempfile.TemporaryDirectory(prefix="orbit-bench-policy-") as scratch:
        home = Path(scratch)
        with seeding.database(kind, home / "home", postgres_url) as url:
            from orbit.store import Store

            store = Store(url)
            try:
                seeding.write_seed(store, seed)
            finally:
                store.close()
            settings = Settings(home=home / "home", database_url=url)
            svc = CoreControlService.from_settings(settings, actor="admin")
            try:
                svc.apply_policy(rules_file(), "bench.yaml")
                started = time.perf_counter()
                report = svc.diff_policy(candidate(), "candidate.yaml", timedelta(days=100))
                wall = time.perf_counter() - started
            finally:
                svc.close()
    return {
        "submissions": report.submissions,
        "wall_s": round(wall, 2),
        "per_s": round(report.submissions / wall),
        "newly_denied": report.newly_denied,
        "rules_changed": len(report.changes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="10,000 runs, 50 samples")
    parser.add_argument("--databases", default="sqlite,postgres")
    seeding.add_postgres_url(parser)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.samples = 10_000, 50
    load = os.getloadavg()
    out: dict[str, Any] = {"load_before": [round(x, 2) for x in load]}
    out["admission"] = admission(args.samples)
    print(json.dumps({"admission": out["admission"]}, indent=2), flush=True)
    for kind in seeding.database_kinds(parser, args.databases):
        figures = replay(kind, args.runs, args.postgres_url)
        out[f"replay {kind} ({args.runs:,} runs)"] = figures
        print(kind, json.dumps(figures), flush=True)
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

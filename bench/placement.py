"""Benchmark: the pure scheduler (orbit.scheduler.ordering.schedule) in-process, on one core.

Run from the repository root (no server, no database, no root; stdlib and orbit.scheduler only):

    .venv/bin/python bench/placement.py                  # 10,000 runs onto 5,000 nodes, sweeps
    .venv/bin/python bench/placement.py --quick          # small sizes, a few seconds: a smoke run
    .venv/bin/python bench/placement.py --nodes 1000,5000 --queue 1000 --repeat 5 --json out.json
    .venv/bin/python bench/placement.py --skip-sweeps --profile   # cProfile of the one pass

The inputs are synthetic and seeded (--seed), so that two runs of the bench see the same nodes
and queue. Nodes: 0-8 GPUs each of A100-40GB, A100-80GB, H100-80GB, L4, T4, H200 (CPU-only
ones too); labels rack, zone, interconnect (nvlink or infiniband on 4- and 8-GPU nodes); about
half busy (Running attempts of tiers 0-3 and 25 users holding some or all GPUs, a few sharing
one, 70% with a known end); 2% cordoned, 2% offline, 1% draining; 1% of GPUs unhealthy; a
few datasets cached. Queue: 1/2/4/8 GPUs of a family, a model, a range (A100..H100) or any;
20% with fallback alternatives (any_of), 15% with a selector, 2% gangs of 2 nodes, 4% sharing
a GPU, 8% CPU-only; tiers 0-3, 25 users (a few much busier), submitted over the last hour
(those older than reserve_after_s reserve a node). The queue asks for more than is free:
many runs wait, and each waiting run's decision says why, which is part of the cost.

 1. one pass, --base-queue runs onto --base-nodes nodes, SchedConfig() defaults (binpack;
    preemption off as shipped, on with --preemption): seconds of schedule()
    (time.perf_counter, gc collected before, left on); placements/s = runs placed / those
    seconds (a gang is one run), decisions/s = every decision (placed, waiting, preempting) /
    those seconds. Goal (the issue): >= 4,000 placements/s. Then with the decision data
    stored: store_cost() makes what the control plane's pass keeps (core/control/scheduling.py,
    _keep): every decision as canonical JSON (codec.dumps), a waiting run's one-line reason
    (explain.one_line), and the pass's inputs (codec.pass_out + dumps); the figure is given
    with and without that (the store's write is not in it yet).
 2. how cost grows: (a) nodes --nodes with the queue at --base-queue; (b) queue --queue with
    --base-nodes nodes. Seconds per pass, placements/s, and the ratio of time and of size to
    the smallest size: time growing like size is linear.
 3. explain of one waiting run of pass 1: its stored record written and read back (dumps +
    json.loads), and a full replay (the stored inputs read back with codec.pass_in, then
    schedule again), checked to give byte-identical decisions.

Every figure is the median of --repeat runs. The process is pinned to one CPU where the OS
allows (os.sched_setaffinity); the load average is printed, as other work moves the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from orbit.scheduler import codec
from orbit.scheduler.explain import one_line
from orbit.scheduler.model import Ask, Gpu, NodeView, Request, Running, SchedConfig, Snapshot
from orbit.scheduler.ordering import collector_paused, schedule
from orbit.scheduler.plan import Plan
from orbit.scheduler.resources import MODELS, parse_gpu

GOAL_PLACEMENTS_S = 4000.0
NOW = 1_800_000_000.0
Weighted = tuple[tuple[Any, float], ...]
NODE_GPUS: Weighted = ((0, 10), (1, 10), (2, 15), (4, 25), (8, 40))
NODE_MODELS: Weighted = (
    ("A100-40GB", 14), ("A100-80GB", 20), ("H100-80GB", 24), ("L4", 14), ("T4", 10), ("H200", 8),
)  # fmt: skip
ASK_MODELS: Weighted = (
    ("A100", 20), ("H100", 20), ("A100..H100", 15), ("A100-80GB", 10), ("L4", 8), ("T4", 5),
    ("H200", 5), ("", 10), (":80GB", 7),
)  # fmt: skip
ASK_GPUS: Weighted = ((1, 40), (2, 25), (4, 20), (8, 15))
TIERS: Weighted = ((0, 5), (1, 15), (2, 55), (3, 25))
USERS: Weighted = tuple((f"user-{k:02d}", 1 / (k + 1)) for k in range(25))
ZONES = ("zone-a", "zone-b", "zone-c", "zone-d")
DATASETS = tuple(f"ds-{k:03d}" for k in range(200))
PROBLEMS = ("xid 79", "ecc 3 uncorrected", "off the bus")


def pick(rng: random.Random, table: Weighted) -> Any:
    return rng.choices([v for v, _ in table], [w for _, w in table])[0]


def make_nodes(count: int, seed: int) -> tuple[NodeView, ...]:
    rng = random.Random(f"{seed}:nodes:{count}")
    nodes = []
    for i in range(count):
        n_gpus = pick(rng, NODE_GPUS)
        model = pick(rng, NODE_MODELS)
        fabric = rng.choice(("nvlink", "infiniband")) if n_gpus >= 4 else "ethernet"
        labels = (
            ("interconnect", fabric),
            ("rack", f"r{i // 40:03d}"),
            ("zone", ZONES[i // 40 % 4]),
        )
        cpus = float(16 * n_gpus if n_gpus else rng.choice((16, 32, 64)))
        used: dict[int, float] = {}
        running: list[Running] = []
        if rng.random() < 0.5:  # partly busy: attempts of 1, 2 or 4 GPUs (or CPU only)
            free = list(range(n_gpus))
            rng.shuffle(free)
            take = rng.randint(1, n_gpus) if n_gpus else 0
            for a in range(8):
                size = min(rng.choice((1, 2, 4)), take)
                if a and size == 0:
                    break
                held, free, take = tuple(sorted(free[:size])), free[size:], take - size
                share = 10.0 if size == 1 and rng.random() < 0.1 else 0.0
                used.update((g, share) for g in held)
                tier, user = pick(rng, TIERS), pick(rng, USERS)
                running.append(
                    Running(
                        attempt_id=f"att-{i}-{a}",
                        run_id=f"old-{i}-{a}",
                        tier=tier,
                        preemptible=tier >= 2 and rng.random() < 0.7,
                        gpus=held,
                        gpu_share_gb=share,
                        cpus=4.0 * max(size, 1),
                        memory_gb=32.0 * max(size, 1),
                        user=user,
                        experiment=f"{user}-exp",
                        started_at=NOW - rng.uniform(60, 86_400),
                        ends_by=NOW + rng.uniform(60, 86_400) if rng.random() < 0.7 else None,
                    )
                )
        gpus = []
        for g in range(n_gpus):
            sick = rng.random() < 0.01
            problem = rng.choice(PROBLEMS) if sick else ""
            memory = MODELS[model.upper()].memory_gb
            gpus.append(Gpu(g, model, memory, used.get(g), healthy=not sick, problem=problem))
        state, offline_s, max_tasks, roll = "active", None, n_gpus + 4, rng.random()
        if roll < 0.02:
            state = "cordoned"
        elif roll < 0.04:
            offline_s = rng.uniform(30, 600)
        elif roll < 0.05:
            max_tasks = 0  # draining
        cached = frozenset(rng.sample(DATASETS, rng.randint(0, 2)))
        nodes.append(
            NodeView(
                id=f"node-{i:05d}",
                name=f"n{i:05d}",
                labels=labels,
                state=state,
                offline_s=offline_s,
                max_tasks=max_tasks,
                gpus=tuple(gpus),
                cpus=cpus,
                memory_gb=cpus * 8,
                disk_free_gb=2000.0,
                running=tuple(running),
                cached=cached,
            )
        )
    return tuple(nodes)


def make_ask(rng: random.Random, family: str | None = None, count: int | None = None) -> Ask:
    family = pick(rng, ASK_MODELS) if family is None else family
    count = pick(rng, ASK_GPUS) if count is None else count
    per = rng.choice((4.0, 8.0))  # CPUs per GPU; 8 GB of memory per CPU
    gpu = parse_gpu(f"{family}:{count}" if family else count)
    return Ask(gpu, cpus=per * count, memory_gb=8 * per * count)


def make_queue(count: int, nodes: int, seed: int) -> list[Request]:
    rng = random.Random(f"{seed}:queue")  # the same prefix at every size
    queue = []
    for i in range(count):
        roll, selector, target, num_nodes = rng.random(), (), None, 1
        if roll < 0.08:
            alternatives = (Ask(cpus=rng.choice((2.0, 4.0, 8.0)), memory_gb=16.0),)
        elif roll < 0.12:
            shared = parse_gpu(rng.choice(("L4", "A100")))
            alternatives = (Ask(shared, gpu_share_gb=8.0, cpus=4.0),)
        elif roll < 0.14:  # a gang: 2 nodes of 4 or 8 H100s or A100s
            num_nodes = 2
            alternatives = (make_ask(rng, rng.choice(("H100", "A100")), rng.choice((4, 8))),)
            selector = (("interconnect", "infiniband"),)
        else:
            first = make_ask(rng)
            alternatives = (first,)
            if rng.random() < 0.2:  # any_of: another family, then maybe half as many
                count = first.gpu.count
                fallbacks = [make_ask(rng, count=count)]
                if count > 1 and rng.random() < 0.5:
                    fallbacks.append(make_ask(rng, count=count // 2))
                alternatives = (first, *fallbacks)
            if rng.random() < 0.15:
                zone, zone2 = rng.choice(ZONES), rng.choice(ZONES)
                selector = rng.choice(
                    (
                        (("interconnect", "nvlink"),),
                        (("zone", zone),),
                        (("interconnect", "infiniband"), ("zone", zone2)),
                    )
                )
            elif rng.random() < 0.002:
                target = f"n{rng.randrange(nodes):05d}"
        tier, user = pick(rng, TIERS), pick(rng, USERS)
        queue.append(
            Request(
                run_id=f"run-{i:06d}",
                attempt_id=f"att-{i:06d}",
                alternatives=alternatives,
                submitted_at=NOW - rng.uniform(0, 3600),
                tier=tier,
                preemptible=tier >= 2 and rng.random() < 0.5,
                selector=selector,
                target=target,
                num_nodes=num_nodes,
                user=user,
                experiment=f"{user}-exp-{rng.randrange(4)}",
                cache_keys=tuple(rng.sample(DATASETS, 1 if rng.random() < 0.3 else 0)),
                max_runtime_s=rng.choice((None, 3600.0, 86_400.0)),
            )
        )
    return queue


def store_cost(plan: Plan, snapshot: Snapshot, queue: list[Request]) -> float:
    """Seconds to make what a pass stores: every decision as canonical JSON (and a waiting
    run's one line), and the pass's inputs (for a replay). The store's own write (save_pass)
    is to be added here."""
    start = time.perf_counter()
    for record in plan.decisions.values():
        codec.dumps(record)
        if record["outcome"] != "placed":
            one_line(record)
    codec.dumps(codec.pass_out(snapshot, queue))
    return time.perf_counter() - start


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def measure(nodes: int, queue_size: int, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    """--repeat passes of `queue_size` runs onto `nodes` nodes: medians, and the last plan."""
    snapshot = Snapshot("bench", NOW, make_nodes(nodes, args.seed))
    queue = make_queue(queue_size, nodes, args.seed)
    config, times, stores, plan = args.config, [], [], Plan()
    for r in range(args.repeat):
        with collector_paused():  # as the server runs a pass (core/control/scheduling.py)
            seconds, plan = timed(partial(schedule, snapshot, queue, config))
            times.append(seconds)
            stores.append(store_cost(plan, snapshot, queue))
        say(f"{nodes:,} nodes, {queue_size:,} runs: pass {r + 1} of {args.repeat}, {seconds:.3f} s")
    s, store = statistics.median(times), statistics.median(stores)
    outcomes = [d["outcome"] for d in plan.decisions.values()]
    placed = len(plan.placements)
    return {
        "nodes": nodes,
        "queue": queue_size,
        "asks": len({(a, q.selector, q.target) for q in queue for a in q.alternatives}),
        "placed": placed,
        "gangs": sum(1 for p in plan.placements if len(p.nodes) > 1),
        "waiting": outcomes.count("waiting"),
        "preempting": outcomes.count("preempting"),
        "decisions": len(outcomes),
        "seconds": s,
        "times": times,
        "placements_s": placed / s,
        "decisions_s": len(outcomes) / s,
        "store_s": store,
        "placements_s_stored": placed / (s + store),
        "_inputs": (snapshot, queue, plan),
    }


def explain(sample: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One waiting run's stored record read back, and a full replay of its pass."""
    snapshot, queue, plan = sample["_inputs"]
    run_id = next(r for r in plan.order if plan.decisions[r]["outcome"] == "waiting")
    record = plan.decisions[run_id]
    inner = 1000  # microseconds each: time a batch
    record_s = []
    for _ in range(args.repeat):
        seconds, _ = timed(lambda: [json.loads(codec.dumps(record)) for _ in range(inner)])
        record_s.append(seconds / inner)
    assert json.loads(codec.dumps(record)) == record
    blob = codec.dumps(codec.pass_out(snapshot, queue))
    stored = codec.dumps(plan.decisions)
    read_s, pass_s = [], []
    for _ in range(args.repeat):
        seconds, inputs = timed(lambda: codec.pass_in(json.loads(blob)))
        read_s.append(seconds)
        seconds, again = timed(partial(schedule, *inputs, args.config))
        pass_s.append(seconds)
        assert codec.dumps(again.decisions) == stored, "the replay gave other decisions"
    read, again_s = statistics.median(read_s), statistics.median(pass_s)
    save_s, explain_ms = from_store(plan, blob, run_id, args.repeat)
    return {
        "save_pass_s": save_s,
        "explain_store_ms": explain_ms,
        "run": run_id,
        "record_ms": statistics.median(record_s) * 1000,
        "record_bytes": len(codec.dumps(record)),
        "decisions_bytes": len(stored),
        "inputs_bytes": len(blob),
        "read_s": read,
        "schedule_s": again_s,
        "replay_s": read + again_s,
        "identical": True,
    }


def from_store(plan: Plan, inputs: bytes, run_id: str, repeat: int) -> tuple[float, float]:
    """What `orbit explain RUN` does past finding the run, on a real SQLite store holding
    the whole pass: the seconds to keep the pass (save_pass: its inputs and every decision),
    and the milliseconds to read one decision back and put it in words (median of `repeat`
    x 100)."""
    import tempfile
    from datetime import UTC, datetime

    from orbit.core.control.scheduling import decision_row
    from orbit.scheduler.explain import lines
    from orbit.store import Store

    rows = [decision_row(d) for d in plan.decisions.values()]
    with tempfile.TemporaryDirectory() as folder:
        store = Store(f"sqlite:///{folder}/orbit.db")
        try:
            counts = (len(plan.placements), len(rows) - len(plan.placements), 0)
            save_s, _ = timed(
                lambda: store.scheduling.save_pass(
                    "pass-1", datetime.now(UTC), {}, inputs, rows, counts, {}
                )
            )

            def words() -> list[str]:
                row = store.scheduling.get_decision(run_id)
                assert row is not None
                return lines(json.loads(row["body"]))

            each = []
            for _ in range(repeat):
                seconds, _ = timed(lambda: [words() for _ in range(100)])
                each.append(seconds / 100 * 1000)
        finally:
            store.close()
    return save_s, statistics.median(each)


def table(title: str, rows: list[dict[str, Any]], key: str) -> None:
    print(f"\n{title}")
    head = ("nodes", "queue", "asks", "placed", "waiting", "s/pass", "placed/s", "decided/s")
    print("".join(f"{h:>10}" for h in head) + f"{'x time':>8}{'x size':>8}")
    base = rows[0]
    for r in rows:
        cells = [f"{r[k]:,}" for k in ("nodes", "queue", "asks", "placed", "waiting")]
        cells += [f"{r['seconds']:.3f}", f"{r['placements_s']:,.0f}", f"{r['decisions_s']:,.0f}"]
        ratios = r["seconds"] / base["seconds"], r[key] / base[key]
        print("".join(f"{c:>10}" for c in cells) + "".join(f"{x:>8.2f}" for x in ratios))


def sizes(text: str) -> list[int]:
    return sorted({int(s.replace("_", "")) for s in text.split(",") if s.strip()})


def pin() -> str:
    """Pin this process to one CPU (the first it may use), where the OS allows."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity here)"
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
    except OSError as e:
        return f"not pinned ({e.strerror})"
    return f"pinned to CPU {cpu}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    quick = "a smoke run of a few seconds: 500 nodes x 1,000 runs, sweeps 250,500 / 200,1000, once"
    add("--quick", action="store_true", help=quick)
    add("--base-nodes", type=int, help="nodes in pass 1, and in sweep (b) (5000)")
    add("--base-queue", type=int, help="queued runs in pass 1, and in sweep (a) (10000)")
    add("--nodes", help="sweep (a), node counts (1000,2000,5000,10000)")
    add("--queue", help="sweep (b), queue lengths (1000,10000,100000)")
    add("--skip-sweeps", action="store_true", help="pass 1 and the explain figures only")
    add("--repeat", type=int, help="passes at each size; the median is given (3)")
    add("--preemption", action="store_true", help="plan preemption too (the default is off)")
    add("--seed", type=int, default=12, help="of the synthetic nodes and queue (12)")
    add("--profile", action="store_true", help="cProfile one more pass 1: top 25 by own time")
    add("--json", metavar="FILE", help="write the figures as JSON to FILE")
    args = parser.parse_args()
    args.base_nodes = args.base_nodes or (500 if args.quick else 5000)
    args.base_queue = args.base_queue or (1000 if args.quick else 10_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.config = SchedConfig(preemption=args.preemption)
    node_sizes = sizes(args.nodes or ("250,500" if args.quick else "1000,2000,5000,10000"))
    queue_sizes = sizes(args.queue or ("200,1000" if args.quick else "1000,10000,100000"))
    pinned, began = pin(), time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - began:6.1f}s] {line}", file=sys.stderr, flush=True)

    print(
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {pinned}; "
        f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.2f}; "
        f"seed {args.seed}; median of {args.repeat}; preemption {args.config.preemption}",
        flush=True,
    )
    done: dict[tuple[int, int], dict[str, Any]] = {}  # sizes measured once, shared by sweeps

    def at(nodes: int, queue: int) -> dict[str, Any]:
        if (nodes, queue) not in done:
            done[nodes, queue] = measure(nodes, queue, args, say)
            if (nodes, queue) != (args.base_nodes, args.base_queue):
                del done[nodes, queue]["_inputs"]  # only pass 1's are used again
        return done[nodes, queue]

    one = at(args.base_nodes, args.base_queue)
    result: dict[str, Any] = {"repeat": args.repeat, "seed": args.seed, "pass": one}
    print(
        f"\n1. one pass: {one['queue']:,} queued runs onto {one['nodes']:,} nodes "
        f"({one['asks']:,} distinct asks)\n"
        f"   placed {one['placed']:,} ({one['gangs']} gangs), waiting {one['waiting']:,}, "
        f"preempting {one['preempting']}; passes {', '.join(f'{t:.3f}' for t in one['times'])} s"
    )
    stored_s = one["seconds"] + one["store_s"]
    print(f"{'':34}{'s/pass':>10}{'placements/s':>14}{'decisions/s':>13}")
    for label, seconds in (("schedule()", one["seconds"]), ("with the data stored", stored_s)):
        rates = f"{one['placed'] / seconds:>14,.0f}{one['decisions'] / seconds:>13,.0f}"
        print(f"   {label:<31}{seconds:>10.3f}{rates}")
        if label == "schedule()":
            print(f"   {'+ decisions, inputs as JSON':<31}{one['store_s']:>10.3f}")
    goal = GOAL_PLACEMENTS_S
    print(
        f"   goal >= {goal:,.0f} placements/s: {one['placements_s'] / goal:.2f} of it "
        f"({'met' if one['placements_s'] >= goal else 'NOT met'}); with the data stored "
        f"{one['placements_s_stored'] / goal:.2f} "
        f"({'met' if one['placements_s_stored'] >= goal else 'NOT met'})",
        flush=True,
    )
    if not args.skip_sweeps:
        result["grow_nodes"] = [at(n, args.base_queue) for n in node_sizes]
        table(f"2a. nodes grow, {args.base_queue:,} runs queued", result["grow_nodes"], "nodes")
        result["grow_queue"] = [at(args.base_nodes, n) for n in queue_sizes]
        table(f"2b. queue grows, {args.base_nodes:,} nodes", result["grow_queue"], "queue")
    ex = result["explain"] = explain(one, args)
    print(
        f"\n3. explain one waiting run of pass 1 ({ex['run']})\n"
        f"   its stored record, dumps + json.loads  {ex['record_ms']:.3f} ms "
        f"({ex['record_bytes']:,} bytes; all of the pass's {ex['decisions_bytes'] / 1e6:.1f} MB)\n"
        f"   full replay: inputs read back {ex['read_s']:.3f} s ({ex['inputs_bytes'] / 1e6:.1f} MB)"
        f" + schedule {ex['schedule_s']:.3f} s = {ex['replay_s']:.3f} s\n"
        f"   replay identical: yes\n"
        f"   on a SQLite store: the pass kept (inputs + {len(one['_inputs'][2].decisions):,} "
        f"decisions) in {ex['save_pass_s']:.3f} s; explain (read one decision, words) "
        f"{ex['explain_store_ms']:.2f} ms (goal < 100 ms)"
    )
    if args.profile:
        snapshot, queue, _ = one["_inputs"]
        profile = cProfile.Profile()
        profile.runcall(schedule, snapshot, queue, args.config)
        print(f"\nprofile of pass 1 ({one['queue']:,} runs onto {one['nodes']:,} nodes):")
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    print(f"\n{time.monotonic() - began:.0f} s in all; load average {os.getloadavg()[0]:.2f} after")
    if args.json:
        del one["_inputs"]
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""ORBIT's `torchrun` task on the node: staged into the bundle, run with the task's interpreter,
standard library only. Its settings are the job's ORBIT_TORCHRUN (orbit.core.tasks.torchrun).

As the task, it:
  - resolves nproc_per_node (`auto`: the attempt's GPUs, or 1 without any) and refuses more
    processes than the attempt has GPUs, before anything starts;
  - runs `python -m torch.distributed.run`: --standalone on one node; across a gang
    (ORBIT_NUM_NODES > 1) the rendezvous at ORBIT_MASTER_ADDR:ORBIT_MASTER_PORT as node
    ORBIT_NODE_RANK, its join bounded by join_timeout_s (torchrun's own default is 600 s);
  - starts every worker through this same file (`--rank`), which keeps the rank's output in
    artifacts/ranks/RANK.log, copies it to training.log prefixed [rankN]: and records how
    the rank ended in artifacts/ranks/RANK.exit.json;
  - exits as the rank that failed first did (torchrun itself exits 1 whatever the code),
    after saying in training.log which rank that was.

A stop (SIGTERM, SIGINT, SIGHUP) goes to torchrun, which stops its workers' process groups.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Refusal(Exception):
    """Bad input found on the node: one line naming the field, before anything starts."""


def ranks_dir() -> str:
    return os.path.join(os.environ.get("ORBIT_ARTIFACTS_DIR", "artifacts"), "ranks")


def attempt_gpus(env: dict[str, str]) -> tuple[int, str]:
    """How many GPUs the attempt has, and where that was read: an agent node names them
    (ORBIT_GPUS), otherwise the attempt has what its job asked for (job.json's resources),
    among those CUDA_VISIBLE_DEVICES shows."""
    if env.get("ORBIT_GPUS"):
        return len([g for g in env["ORBIT_GPUS"].split(",") if g.strip()]), "ORBIT_GPUS"
    try:
        with open(os.path.join(env["ORBIT_BUNDLE_DIR"], "job.json"), encoding="utf-8") as f:
            resources = json.load(f).get("resources", {})
        return _count(resources), "the job's resources"
    except (KeyError, OSError, ValueError):
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        return len([g for g in visible.split(",") if g.strip()]), "CUDA_VISIBLE_DEVICES"


def _count(resources: dict[str, Any]) -> int:
    gpu = resources.get("gpu")
    if gpu is None:
        return int(resources.get("gpu_count", 0))
    if isinstance(gpu, int):
        return gpu
    text = str(gpu).strip()
    if text.upper() in ("NONE", "0", "CPU"):
        return 0
    last = text.rsplit(":", 1)[-1]  # the compact form: MODEL[:MEMORY][:COUNT]
    return int(last) if last.isdigit() else 1


def processes(asked: int | str, gpus: tuple[int, str]) -> int:
    count, source = gpus
    if asked == "auto":
        return max(1, count)
    if 0 < count < int(asked):
        raise Refusal(
            f"task.nproc_per_node: {asked} processes, but this attempt has {count} GPU(s) "
            f"({source}): one process per GPU at most (or nproc_per_node: auto)"
        )
    return int(asked)


def torchrun_options(settings: dict[str, Any], nproc: int, env: dict[str, str]) -> list[str]:
    options = [f"--nproc-per-node={nproc}", f"--max-restarts={settings['max_restarts']}"]
    nodes = int(env.get("ORBIT_NUM_NODES") or 1)
    if nodes <= 1:
        return [*options, "--standalone"]  # a rendezvous on a free local port
    missing = [n for n in ("ORBIT_MASTER_ADDR", "ORBIT_MASTER_PORT") if not env.get(n)]
    if missing:
        raise Refusal(f"ORBIT_NUM_NODES is {nodes}, but {' and '.join(missing)} not set")
    rdzv = settings["rdzv"]
    timeout = math.ceil(float(settings["join_timeout_s"]))
    key = "timeout" if rdzv["backend"] == "static" else "join_timeout"
    conf = {key: timeout, **rdzv["conf"]}
    options += [
        f"--nnodes={nodes}",
        f"--rdzv-backend={rdzv['backend']}",
        f"--rdzv-endpoint={env['ORBIT_MASTER_ADDR']}:{env['ORBIT_MASTER_PORT']}",
        f"--rdzv-id={env.get('ORBIT_RUN_ID', 'manual')}",
        "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items()),
    ]
    if rdzv["backend"] == "static":  # the gang's ranks; c10d ranks nodes as they join
        options.append(f"--node-rank={int(env.get('ORBIT_NODE_RANK') or 0)}")
    return options


def launch() -> int:
    settings = json.loads(os.environ["ORBIT_TORCHRUN"])
    env = dict(os.environ)
    try:
        nproc = processes(settings["nproc_per_node"], attempt_gpus(env))
        options = torchrun_options(settings, nproc, env)
    except Refusal as exc:
        print(f"orbit: {exc}", file=sys.stderr, flush=True)
        return 2
    if importlib.util.find_spec("torch") is None:
        print(f"orbit: torchrun: no torch for {sys.executable} (task.interpreter)", file=sys.stderr)
        return 2
    os.makedirs(ranks_dir(), exist_ok=True)
    for name in os.listdir(ranks_dir()):  # a rerun in the same folder: only this run's records
        if name.endswith(".exit.json"):
            os.unlink(os.path.join(ranks_dir(), name))
    worker = [os.path.abspath(__file__), "--rank", *(["-m"] if settings["module"] else [])]
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *options,
        *worker,
        settings["target"],
        *settings["args"],
    ]
    print(f"orbit: {shlex.join(argv)}", flush=True)
    # torchrun in a session of its own gets one stop signal, from here: a second one, from
    # the wrapper's signal to this process group, would cut its shutdown of the workers short
    torchrun = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    stopped: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        stopped.append(signum)
        torchrun.send_signal(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    code = torchrun.wait()
    if code == 0 or stopped:
        return code
    return report_failure(code, settings, env)


def report_failure(code: int, settings: dict[str, Any], env: dict[str, str]) -> int:
    """Say which rank failed first and end as it did; no rank at all: say why that may be."""
    ended = []
    for name in os.listdir(ranks_dir()):
        if name.endswith(".exit.json"):
            with open(os.path.join(ranks_dir(), name), encoding="utf-8") as f:
                ended.append(json.load(f))
    latest = max((e["restart"] for e in ended), default=0)  # torchrun's last restart round
    failed = sorted(
        (e for e in ended if e["restart"] == latest and e["code"] != 0), key=lambda e: e["at"]
    )
    if not failed:
        nodes = int(env.get("ORBIT_NUM_NODES") or 1)
        why = (
            f"did every one of the {nodes} nodes join the rendezvous at "
            f"{env.get('ORBIT_MASTER_ADDR')}:{env.get('ORBIT_MASTER_PORT')} within "
            f"{settings['join_timeout_s']:g} s (task.join_timeout_s)? "
            if nodes > 1
            else ""
        )
        print(f"orbit: torchrun exited with {code} and no worker failed: {why}see above")
        return code
    first = failed[0]
    how = f"exit code {first['code']}" if first["code"] > 0 else _signal_name(-first["code"])
    print(
        f"orbit: rank {first['rank']} failed first: {how} (its output: ranks/{first['rank']}.log)"
        f"; {len(failed)} of {len(ended)} rank(s) on this node failed",
        flush=True,
    )
    return end_as(first["code"])


def _signal_name(number: int) -> str:
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"killed by signal {number}"


def end_as(code: int) -> int:
    """A code to exit with, or for a signal the same signal, so that the wrapper records
    what the worker met (task_killed with its signal, not a made-up exit code)."""
    if code < 0:
        sys.stdout.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal that does not end a process (SIGCHLD...)
    return code


def rank(argv: list[str]) -> int:
    """One worker: the target as `python -u` would run it, its output kept apart."""
    module = argv[:1] == ["-m"]
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    me = os.environ.get("RANK", "0")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    cmd = [sys.executable, "-u", *(["-m"] if module else []), target, *args]
    child = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert child.stdout is not None
    # torchrun stops a worker by signalling its process group: the child has it already
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: None)
    with open(os.path.join(ranks_dir(), f"{me}.log"), "ab") as log:
        if restart:
            log.write(f"--- torchrun restart {restart} ---\n".encode())
        pump(child.stdout.fileno(), log, f"[rank{me}]: ".encode(), masker())
    code = child.wait()
    record = {"rank": int(me), "restart": restart, "code": code, "at": time.time()}
    # named as the wrapper's own (NAME.tmp-PID), which an agent does not send mid-write
    tmp = os.path.join(ranks_dir(), f"{me}.exit.json.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(ranks_dir(), f"{me}.exit.json"))
    return end_as(code)


def masker() -> Any:
    """The run's secrets (ORBIT_SECRET_NAMES, which the wrapper sets beside them) as the
    bundle's redactor (scripts/orbit_redact.py), for a rank's own log; None without any.
    training.log is masked by the wrapper itself."""
    names = [n for n in os.environ.get("ORBIT_SECRET_NAMES", "").split(",") if n]
    values = [os.environ[n].encode("utf-8") for n in names if os.environ.get(n)]
    if not values:
        return None
    scripts = os.path.join(os.environ.get("ORBIT_BUNDLE_DIR", ""), "scripts")
    sys.path.insert(0, scripts)
    import orbit_redact  # type: ignore[import-not-found]

    return orbit_redact.Redactor(values)


def pump(fd: int, log: Any, prefix: bytes, mask: Any = None) -> None:
    """Everything the worker writes: into its log (its secrets masked), by whole lines to
    training.log (so that the ranks' lines do not cut into each other there)."""
    pending = b""
    while chunk := os.read(fd, 1 << 16):
        log.write(mask.feed(chunk) if mask is not None else chunk)
        log.flush()
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > 1 << 16:  # a very long line with no end yet
            lines, pending = [*lines, pending], b""
        if lines:
            write_all(1, b"".join(prefix + line + b"\n" for line in lines))
    if pending:
        write_all(1, prefix + pending + b"\n")
    if mask is not None:
        log.write(mask.flush())


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rank"]:
        return rank(argv[1:])
    return launch()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""ORBIT's launcher for the `swift` task type: staged into the workdir, run with the python
that has ms-swift, it becomes `swift MODE ...` (exec: the same process, so the wrapper's stop
of the task's process group reaches swift's torchrun and every training process).

What ms-swift gets wrong on a shared box, set here per attempt, from the attempt's env:
  CUDA_VISIBLE_DEVICES  exactly the attempt's GPUs (ORBIT_GPUS), NPROC_PER_NODE their count
  NNODES NODE_RANK MASTER_ADDR MASTER_PORT  from the gang's ORBIT_NUM_NODES, ORBIT_NODE_RANK,
                        ORBIT_MASTER_ADDR, ORBIT_MASTER_PORT; one node: a free MASTER_PORT
  --vllm_server_group_port  free (GRPO's weight sync with a rollout server; default 51216)
  --output_dir          $ORBIT_ARTIFACTS_DIR/checkpoints unless the request names one
  --resume_from_checkpoint  the newest checkpoint-N of ORBIT_RESUME_FROM (an earlier attempt's)
  --vllm_server_host/_port  GRPO's rollout server: from an env var, or the URL of a service the
                        node advertises (ORBIT_SERVICES, set by `orbit agent --service NAME=URL`)
  --port                `swift rollout`'s, checked free (ms-swift would move to the next free
                        one, away from the URL the node advertises)

The request, shaped before freezing, is in ORBIT_SWIFT. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
from typing import Any, NoReturn

RUN_FOLDER = re.compile(r"^v(\d+)-")  # ms-swift's output_dir/vN-DATE-TIME
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
HOST_PORT = re.compile(r"^(?:https?://)?\[?([^\]/]+?)\]?:(\d+)/?$")  # a rollout server's URL


def refuse(line: str) -> NoReturn:
    """What the request asks for is not on this node: one line, exit 2 (before swift starts)."""
    print(f"orbit: {line}", file=sys.stderr, flush=True)
    sys.exit(2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def gpus_env(env: dict[str, str], job: dict[str, Any]) -> dict[str, str]:
    """The attempt's GPUs: ORBIT_GPUS where a node chose them; else the job's gpu_count first
    devices (a local run: this machine's own); none: CPU."""
    chosen = env.get("ORBIT_GPUS", "")
    if chosen:
        devices = chosen.split(",")
    else:
        count = int((job.get("resources") or {}).get("gpu_count") or 0)
        devices = [str(i) for i in range(count)]
    out = {"CUDA_VISIBLE_DEVICES": ",".join(devices)}
    if devices:
        out["NPROC_PER_NODE"] = str(len(devices))
    nodes = int(env.get("ORBIT_NUM_NODES") or 1)
    if nodes > 1:
        out.update(
            NNODES=str(nodes),
            NODE_RANK=env.get("ORBIT_NODE_RANK", "0"),
            MASTER_ADDR=env["ORBIT_MASTER_ADDR"],
            MASTER_PORT=env["ORBIT_MASTER_PORT"],
        )
    elif len(devices) > 1:  # torchrun's default 29500 is every run's on this node
        out.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return out


def run_folders(output_dir: str) -> list[str]:
    """ms-swift's run folders under output_dir, newest last: vN by N, not by name (v10 > v9)."""
    try:
        names = os.listdir(output_dir)
    except OSError:
        return []
    found = []
    for name in names:
        m = RUN_FOLDER.match(name)
        if m and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), name))
    return [os.path.join(output_dir, name) for _, name in sorted(found)]


def newest_checkpoint(path: str) -> str | None:
    """The checkpoint-N to go on from: `path` itself if it is one; in a run folder, the one its
    last-checkpoint link or its last logging.jsonl line's last_model_checkpoint names, else
    the highest N; in an output_dir, that of its newest run folder that has one."""
    name = os.path.basename(os.path.normpath(path))
    if CHECKPOINT.match(name) and os.path.isdir(path):
        return path
    if not RUN_FOLDER.match(name):
        for folder in reversed(run_folders(path)):
            found = newest_checkpoint(folder)
            if found:
                return found
        return None
    for said in (_link(path), _logged(path)):
        if said and os.path.isdir(said) and CHECKPOINT.match(os.path.basename(said)):
            return said
    numbered: list[tuple[int, str]] = []
    for entry in os.listdir(path):
        m = CHECKPOINT.match(entry)
        if m and os.path.isdir(os.path.join(path, entry)):
            numbered.append((int(m.group(1)), os.path.join(path, entry)))
    # a save cut short (a stop during it) has no trainer_state.json, its last file, yet (as
    # orbit.runtime.checkpoint_finder's newest_checkpoint reads it, for ORBIT's own staging)
    saved = [n for n in numbered if os.path.exists(os.path.join(n[1], "trainer_state.json"))]
    return max(saved or numbered)[1] if numbered else None


def _link(run: str) -> str | None:
    link = os.path.join(run, "last-checkpoint")
    return os.path.realpath(link) if os.path.islink(link) else None


def _logged(run: str) -> str | None:
    try:
        with open(os.path.join(run, "logging.jsonl"), "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            said = json.loads(line).get("last_model_checkpoint")
        except (ValueError, AttributeError):
            continue
        if isinstance(said, str):
            return os.path.join(run, os.path.basename(said))  # its path may be another node's
    return None


def endpoint(vllm: dict[str, Any], env: dict[str, str]) -> list[str]:
    """Server mode: where the rollout server is (its env var may be set by a second run, or
    it is a service this node advertises), and a free port of this node for the weight sync."""
    if vllm.get("mode") != "server":
        return []
    argv: list[str] = []
    name, service = vllm.get("endpoint_env"), vllm.get("service")
    where, value = "", None
    if service:
        services = json.loads(env.get("ORBIT_SERVICES") or "{}")
        if service not in services:
            known = ", ".join(sorted(services)) or "none"
            refuse(f"task.vllm.service: {service} is not advertised on this node (it has: {known})")
        where, value = f"task.vllm.service: {service}", services[service]
    elif name and not vllm.get("server_host"):
        where, value = f"task.vllm.endpoint_env: ${name}", env.get(name, "")
    if value is not None:
        m = HOST_PORT.match(value)
        if not m:
            refuse(f"{where} is {value!r}, not http://HOST:PORT")
        argv += ["--vllm_server_host", m.group(1), "--vllm_server_port", m.group(2)]
    return [*argv, "--vllm_server_group_port", str(free_port())]


def rollout_port(settings: dict[str, Any], argv: list[str]) -> list[str]:
    """`swift rollout`'s port, given if args did not, and free: ms-swift would take the next
    free one instead, which the node's --service URL does not name."""
    port = int(settings["port"])
    try:
        with socket.socket() as s:
            s.bind(("", port))
    except OSError:
        refuse(f"task.args.port: {port} is in use on this node (swift rollout would move off it)")
    return [] if "--port" in argv else ["--port", str(port)]


def swift_program() -> str:
    """`swift` beside this python (a venv need not be activated), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "swift")
    return beside if os.access(beside, os.X_OK) else (shutil.which("swift") or "swift")


def local_paths(argv: list[str]) -> list[str]:
    """Model and dataset paths relative to the workdir made absolute: ms-swift would take a
    relative one that is not absolute for a hub id."""
    out, flag = [], ""
    for arg in argv:
        if arg.startswith("--"):
            flag = arg
        elif flag in _PATH_FLAGS and not os.path.isabs(arg) and os.path.exists(arg):
            arg = os.path.abspath(arg)
        out.append(arg)
    return out


def command(settings: dict[str, Any], env: dict[str, str]) -> list[str]:
    artifacts = env.get("ORBIT_ARTIFACTS_DIR", "artifacts")
    output_dir = os.path.join(artifacts, settings.get("output_dir") or "checkpoints")
    argv = [swift_program(), settings["subcommand"], *local_paths(settings["argv"])]
    if settings["subcommand"] in ("sft", "pt", "rlhf"):
        argv += ["--output_dir", output_dir]
        resume = env.get("ORBIT_RESUME_FROM")
        given = "--resume_from_checkpoint" in settings["argv"]
        checkpoint = newest_checkpoint(resume) if resume and not given else None
        if checkpoint:
            argv += ["--resume_from_checkpoint", checkpoint]
        elif resume and not given:
            print(f"orbit: no checkpoint-N in {resume}: starting afresh", flush=True)
    if settings["subcommand"] == "rollout":  # a server: no output_dir in ms-swift's rollout
        argv += rollout_port(settings, argv)
    return argv + endpoint(settings.get("vllm") or {}, env)


def version_mismatch(declared: str) -> str | None:
    """A 3.x request on a 4.x install (or back) fails on the renamed --train_type."""
    try:
        from importlib.metadata import version

        installed = version("ms-swift")
    except Exception:
        return None  # no such distribution: the precheck says what is missing
    if installed.split(".")[0] != declared.split(".")[0]:
        return f"the request is for ms-swift {declared}, this python has {installed}"
    return None


def main() -> int:
    settings = json.loads(os.environ["ORBIT_SWIFT"])
    env = dict(os.environ)
    job: dict[str, Any] = {}
    bundle = env.get("ORBIT_BUNDLE_DIR")
    if bundle:
        with open(os.path.join(bundle, "job.json"), encoding="utf-8") as f:
            job = json.load(f)
    mismatch = version_mismatch(settings["version"])
    if mismatch:
        sys.exit(f"orbit: task.version: {mismatch}")
    env.update(gpus_env(env, job))
    argv = command(settings, env)
    shown = {k: env[k] for k in sorted(env) if k in _SHOWN}
    print(f"orbit: {json.dumps(shown, sort_keys=True)}", flush=True)
    print(f"orbit: {' '.join(argv)}", flush=True)
    os.execvpe(argv[0], argv, env)
    return 127  # not reached


_PATH_FLAGS = ("--model", "--dataset", "--val_dataset", "--adapters", "--ref_model")
_SHOWN = (
    "CUDA_VISIBLE_DEVICES",
    "NPROC_PER_NODE",
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)

if __name__ == "__main__":
    sys.exit(main())

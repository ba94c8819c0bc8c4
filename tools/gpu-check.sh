#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, as root, with ORBIT importable by $PYTHON (default python3,
# the one that holds PyTorch): a real `orbit server` and `orbit agent` on loopback, the agent's
# task running as a uid of its own (issue 23), a PyTorch run on the GPU through it with its
# checkpoints, progress and NVML audit, then the agent killed with its wrapper and task (a
# reboot) and brought back, and the retry resuming from the newest checkpoint (issue 24).
# Prints what it saw; the logs go to ${OUT:-/tmp}. TASK_UIDS=none: tasks as the agent's user;
# TASK_PYTHON: the task's interpreter (an ORBIT installed in the torch venv takes that venv out of
# the task's PATH, as it does its own).
set -u
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp}
W=$(mktemp -d /tmp/orbit-gpu-XXXX)
chmod 711 "$W"
export ORBIT_HOME=$W/home ORBIT_NODE_HEARTBEAT_S=1 ORBIT_NODE_OFFLINE_S=4 ORBIT_NODE_LOST_GRACE_S=2
mkdir -p "$ORBIT_HOME"
port=18470
say() { printf '\n== %s\n' "$*"; }
cleanup() { kill -9 "${agent:-0}" "${server:-0}" 2>/dev/null; cp "$W"/*.log "$OUT"/ 2>/dev/null; }
trap cleanup EXIT

"$PY" -m orbit server --port $port --database-url "sqlite:///$W/home/orbit.db" >"$W/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  "$PY" -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$port/healthz').status_code != 200)" \
    2>/dev/null && break
  kill -0 $server 2>/dev/null || { tail -5 "$W/server.log"; exit 1; }
  sleep 0.2
done
export ORBIT_SERVER=http://127.0.0.1:$port ORBIT_TOKEN
ORBIT_TOKEN=$(cat "$ORBIT_HOME/admin-token")
"$PY" -m orbit nodes join-token create >"$W/join.token" || exit 1
start_agent() {
  "$PY" -m orbit agent --server "$ORBIT_SERVER" --join-token-file "$W/join.token" --name gpu \
    --work-dir "$W/agent" --max-tasks 2 ${TASK_UIDS:+--task-uids $TASK_UIDS} >>"$W/agent.log" 2>&1 &
  agent=$!
}
start_agent
sleep 4
say "the node, as its agent reports it (real NVML)"
"$PY" -m orbit nodes show gpu
grep -E 'tasks run as' "$W/agent.log"

mkdir -p "$W/job"
cat >"$W/job/train.py" <<'EOF'
import getpass, json, os, time
import torch

art = os.environ["ORBIT_ARTIFACTS_DIR"]
print("uid", os.getuid(), "user", getpass.getuser(), "home", os.environ["HOME"], flush=True)
print("credentials in env:", sorted(k for k in os.environ if "TOKEN" in k or "CREDENTIAL" in k))
try:
    open(os.path.join(os.environ["ORBIT_BUNDLE_DIR"], "..", "..", "agent-identity.json")).read()
    print("READ THE NODE'S IDENTITY")
except OSError as exc:
    print("the node's identity:", type(exc).__name__)
start = int(os.path.basename(os.environ.get("ORBIT_RESUME_FROM", "step-0")).split("-")[1].split(".")[0])
print("resume from", os.environ.get("ORBIT_RESUME_FROM"), "step", start, flush=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"
print(torch.cuda.get_device_name(0) if dev == "cuda" else "no GPU: on the CPU", flush=True)
a = torch.randn(8192 if dev == "cuda" else 256, 8192 if dev == "cuda" else 256, device=dev)
os.makedirs(f"{art}/checkpoints", exist_ok=True)
for step in range(start + 1, 121):
    b = a @ a
    if dev == "cuda":
        torch.cuda.synchronize()
    with open(f"{art}/logging.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "max_steps": 120, "loss": float(b.float().abs().mean()) / step}) + "\n")
    if step % 10 == 0:
        torch.save({"step": step}, f"{art}/checkpoints/.step.tmp.pt")
        os.replace(f"{art}/checkpoints/.step.tmp.pt", f"{art}/checkpoints/step-{step}.pt")
    time.sleep(0.1)
print("done at", step)
EOF
cat >"$W/job/spec.yaml" <<EOF
experiment: gpu-check
task_type: python
template: pool
task: {script: train.py, interpreter: ${TASK_PYTHON:-python3}}
overrides: {resources: {gpu_count: ${GPUS:-1}}}
retry: {max_retries: 3, backoff_s: 0}
EOF
run=$("$PY" -m orbit submit "$W/job/spec.yaml" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])')
[ -n "$run" ] || { tail -5 "$W/agent.log"; exit 1; }
say "run $run submitted; waiting for checkpoint step-40 on the node"
for _ in $(seq 300); do
  ls "$W"/agent/attempts/*/artifacts/checkpoints/step-40.pt >/dev/null 2>&1 && break
  state=$("$PY" -m orbit status "$run" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  case "$state" in succeeded|failed|terminated) "$PY" -m orbit logs "$run"; exit 1 ;; esac
  sleep 0.2
done
"$PY" -m orbit status "$run"
say "reboot: the agent, the wrapper and the task killed at once, the node away for 10 s"
kill -9 $agent
for p in /proc/[0-9]*; do
  grep -qz "ORBIT_ATTEMPT_ID=$run" "$p/environ" 2>/dev/null && kill -9 "${p#/proc/}" 2>/dev/null
done
ls "$W"/agent/attempts/*/artifacts/checkpoints/
sleep 10
"$PY" -m orbit status "$run"
start_agent
for _ in $(seq 240); do
  state=$("$PY" -m orbit status "$run" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [ "$state" = succeeded ] || [ "$state" = failed ] || [ "$state" = terminated ] && break
  sleep 0.5
done
say "after the node came back"
"$PY" -m orbit runs show "$run"
say "logs of each attempt"
for n in 1 2 3; do "$PY" -m orbit logs "$run" --attempt $n 2>/dev/null | head -8; done
say "inspect"
"$PY" -m orbit inspect "$run"
say "collect"
"$PY" -m orbit collect "$run" --dest "$W/out"
head -3 "$W/out/nvml-audit.jsonl"
wc -l "$W/out/nvml-audit.jsonl"
say "attempt folders on the node (owner, mode)"
stat -c '%U %G %a %n' "$W"/agent/attempts/* "$W/agent/bundles" "$W/agent/agent-identity.json"

#!/usr/bin/env bash
# The main job, end to end: install ORBIT into ./.venv if needed, submit the example training
# run, wait for it, then show its status, logs and artifacts.
# State goes to $ORBIT_HOME (default here: ./.demo-home), so it never touches ~/.orbit.
set -euo pipefail
cd "$(dirname "$0")"
. tools/venv.sh
export ORBIT_HOME="${ORBIT_HOME:-$PWD/.demo-home}"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

run=$(orbit submit examples/tiny-train/spec.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "submitted $run (state in $ORBIT_HOME)"
step orbit logs "$run" --follow
step orbit status "$run"
step orbit runs show "$run"
step orbit logs "$run" --layer runtime
step orbit inspect "$run"
step orbit collect "$run" --dest "orbit-artifacts/$run"
step find "orbit-artifacts/$run" -type f
step tail -n 3 "orbit-artifacts/$run/logging.jsonl"
printf '\nExplore more with: export ORBIT_HOME=%s PATH=%s/.venv/bin:$PATH; orbit --help\n' "$ORBIT_HOME" "$PWD"

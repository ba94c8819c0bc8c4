#!/usr/bin/env bash
# Makes ./.venv-swift: CPU torch and ms-swift, apart from .venv so that ORBIT's own venv stays
# light. The swift task's end-to-end test (tests/core/tasks/test_swift_e2e.py) and
# examples/swift-sft run in it; tools/swift_args.py regenerates the argument-name list from it.
# Measured on a 2-core box with warm pip caches: about 2 minutes (torch's CPU wheel is a local
# file; ms-swift pulls transformers, peft, trl, datasets and the rest from PyPI).
# Reinstalls when this script changes. Needs python3 >= 3.10.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=.venv-swift
stamp=$venv/.orbit-installed
want=$(sha256sum tools/swift-venv.sh | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
[ -x $venv/bin/python ] || "$python" -m venv $venv
pip=($venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" torch==2.13.0
"${pip[@]}" ms-swift==4.6.0
echo "$want" >"$stamp"

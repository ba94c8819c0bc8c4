#!/usr/bin/env bash
# Runs this ORBIT bundle by hand: `bash scripts/run.sh` from anywhere, on any box with bash and
# python3. Status lands in runtime/, the task's output and files in artifacts/.
# Add --detach to let it go on after this shell exits.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${ORBIT_PYTHON:-python3}" "$here/orbit_wrapper.py" --bundle "$here/.." "$@"

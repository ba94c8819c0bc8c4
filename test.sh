#!/usr/bin/env bash
# The whole test suite: ruff (lint + format check), mypy, then pytest on real SQLite and
# PostgreSQL (set ORBIT_TEST_POSTGRES_URL if yours is not postgres@127.0.0.1:5432).
# Extra arguments go to pytest, e.g. ./test.sh -k bundle -x
set -euo pipefail
cd "$(dirname "$0")"
. tools/venv.sh
# one command a line: under `set -e` a failure inside an `a && b` list does not stop the script
echo "== ruff"
ruff check src tests bench examples tools
ruff format --check src tests bench examples tools
echo "== mypy"
mypy
echo "== pytest"
exec pytest "$@"

#!/usr/bin/env bash
# Makes .venv-debian: ORBIT and its test tools under the system's own python3 (Debian 12's is
# 3.11.2, older than the tar filters of 3.11.4), for the tests .ci/run runs under it as well.
# Reinstalls when pyproject.toml changes. Prints nothing and exits 3 where /usr/bin/python3 is
# missing or older than 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
python=/usr/bin/python3
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || exit 3
if [ ! -x .venv-debian/bin/python ]; then
  "$python" -m venv .venv-debian
fi
stamp=.venv-debian/.orbit-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv-debian/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' >&2
  echo "$want" >"$stamp"
fi

# Sourced by demo.sh and test.sh: makes ./.venv with ORBIT and its dev tools installed, and
# reinstalls when pyproject.toml changes. Needs only python3 (>= 3.11) on PATH.
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "ORBIT needs Python >= 3.11 (found: $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv ..." >&2
  "$python" -m venv .venv
fi
stamp=.venv/.orbit-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing ORBIT into .venv ..." >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' >&2
  echo "$want" >"$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"

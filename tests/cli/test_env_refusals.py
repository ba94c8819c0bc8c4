"""A run's environment at submit, through the real CLI: a name no process can be given, a
secret's name however it is spelled, and a credential pasted in as a value are each refused in
one line naming the field, never the value, exit 2, with nothing written. Embedded and against
a real `orbit server` the line is the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import write_spec
from tests.orbit_server import Server

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----\n"
HINT = "orbit secrets set NAME"

CASES = [
    ({"BAD-NAME": "plain-value-1"}, [], "env.BAD-NAME: not an environment variable name"),
    ({"HfToken": "plain-value-2"}, [], "env.HfToken: the name looks like a secret's"),
    ({"WANDB_APIKEY": "plain-value-3"}, [], "env.WANDB_APIKEY: the name looks like a secret's"),
    ({"MY_VAR": HF}, [], "env.MY_VAR: the value looks like a Hugging Face token"),
    ({"KEY_ID": AWS}, [], "env.KEY_ID: the value looks like an AWS access key id"),
    ({"SIGNING": PEM}, [], "env.SIGNING: the value looks like a private key"),
    # from the template's side: the server resolves it, the line is still the same
    ({}, ["--set", f"runtime_env.EXTRA={HF}"], "env.EXTRA: the value looks like a Hugging"),
]


def orbit(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orbit", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_env_is_refused_alike_embedded_and_remote(orbit_server: Server, tmp_path: Path) -> None:
    embedded = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")},
        "ORBIT_HOME": str(tmp_path / "embedded-home"),
    }
    modes = {"embedded": embedded, "remote": orbit_server.env()}
    for task_env, sets, line in CASES:
        spec = write_spec(tmp_path, task={"command": "echo hello", "env": task_env})
        said = {mode: refusal(env, tmp_path, spec, sets, task_env) for mode, env in modes.items()}
        assert said["embedded"] == said["remote"], said
        assert said["embedded"].startswith(f"orbit: error: {line}"), said
        if "not an environment variable name" not in line:
            assert HINT in said["embedded"]
    for mode, env in modes.items():
        listed = orbit(env, tmp_path, "runs", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == [], mode  # nothing was written


def refusal(
    env: dict[str, str], cwd: Path, spec: Path, sets: list[str], task_env: dict[str, str]
) -> str:
    """The one line a refused submit says on stderr, checked to hold no value and no trace."""
    proc = orbit(env, cwd, "submit", str(spec), *sets)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert proc.stdout == "", output
    assert len(proc.stderr.splitlines()) == 1, output
    assert "Traceback" not in output
    for value in (*task_env.values(), HF):
        assert value.strip() not in output, output
    return proc.stderr.strip()

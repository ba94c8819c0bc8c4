"""Benchmark: `orbit logs RUN` of a large log on an SSH host, beside `ssh HOST cat FILE`.

Run from the repository root, as root (it starts a real sshd on a loopback port, with the
fixtures of tests/sshd.py):

    .venv/bin/python bench/logs.py                          # a 52 MB log, 3 runs each
    .venv/bin/python bench/logs.py --size-mb 8 --repeat 1   # a smoke run
    .venv/bin/python bench/logs.py --json

A run on the host writes the log (base64 text, 100 columns); then each figure is the median over
--repeat runs, taken in turn, every one on a fresh SSH connection, its output to /dev/null:

    ssh cat     `ssh HOST cat FILE`: the bytes as they are, the reference
    orbit logs  `orbit logs RUN`: the CLI end to end (interpreter start and imports, the store,
                the connection, the log streamed in one ssh call)
    stream      SshHostProcessBackend.stream_log in this process: what `orbit logs` does once
                the CLI has started
    chunks      the read_log loop `orbit logs` made before: 1 MiB base64 JSON chunks through
                hostside.py, one ssh call each
    cli start   `orbit --version`: the interpreter and imports alone, for scale
    ssh tail    `ssh HOST tail -n 100 FILE`: the reference for the next
    orbit tail  `orbit logs RUN --tail 100`: the log's end found and read, never the whole log

ratio = seconds / ssh cat seconds (orbit tail: / ssh tail seconds); the goal for `orbit logs`
is <= 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/sshd.py: the real sshd

from tests.sshd import SshdFactory

from orbit.core.execution.backends.base import LogLayer
from orbit.core.execution.backends.ssh_host_process import NoHosts, SshHostProcessBackend
from orbit.core.execution.ssh.transport import Ssh, options_for
from orbit.model.config import Settings
from orbit.model.hosts import HostSpec
from orbit.model.models import RunHandle

ORBIT = [sys.executable, "-m", "orbit"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=52, help="the log's size, in 10^6 bytes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="orbit-bench-logs-") as scratch_name:
        scratch = Path(scratch_name)
        factory = SshdFactory(scratch)
        try:
            report = measure(factory, scratch, args.size_mb * 10**6, args.repeat)
        finally:
            factory.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"a {report['log_bytes'] / 1e6:.1f} MB log over SSH (loopback), median of "
        f"{args.repeat}; ratio = seconds / `ssh cat` seconds (goal for orbit logs: <= 2)"
    )
    for name in (
        "ssh_cat",
        "orbit_logs",
        "stream",
        "chunks",
        "cli_start",
        "ssh_tail",
        "orbit_tail",
    ):
        seconds, ratio = report[name]["seconds"], report[name]["ratio"]
        print(f"  {name.replace('_', ' '):<11} {seconds:7.2f} s  ratio {ratio:6.2f}")
    return 0


def measure(factory: SshdFactory, scratch: Path, size: int, repeat: int) -> dict[str, object]:
    server = factory(alias="bench-host")
    home = scratch / "home"
    home.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(
                None,
                [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH")],
            )
        ),
        "ORBIT_HOME": str(home),
        "ORBIT_DATABASE_URL": f"sqlite:///{home / 'orbit.db'}",
        "ORBIT_SSH_CONFIG": str(server.config),
    }

    def orbit(
        *argv: str, stdout: int | None = subprocess.PIPE
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*ORBIT, *argv], env=env, stdout=stdout, stderr=subprocess.PIPE, check=True
        )

    orbit("hosts", "add", "bench-host", "--ssh", server.alias, "--work-dir", str(server.work_root))
    job = scratch / "job"
    job.mkdir()
    raw = size * 3 // 4 * 100 // 101  # base64 with a newline every 100 columns comes to ~size
    (job / "spec.yaml").write_text(
        json.dumps(
            {
                "experiment": "bench",
                "task_type": "command",
                "template": "targon-rental-host",
                "task": {"command": f"head -c {raw} /dev/urandom | base64 -w 100"},
                "overrides": {"target": "bench-host", "resources": {"gpu_count": 0}},
            }
        )
    )
    run = json.loads(orbit("submit", str(job / "spec.yaml"), "--wait", "--json").stdout)
    handle = RunHandle.model_validate(run["attempts"][0]["handle"])
    path = Path(handle.location) / "artifacts" / "training.log"
    log_bytes = path.stat().st_size
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    shown = orbit("logs", run["id"]).stdout  # once, checked: the same bytes
    assert hashlib.sha256(shown).hexdigest() == expected, "orbit logs printed other bytes"
    last = b"".join(path.read_bytes().splitlines(keepends=True)[-100:])
    assert orbit("logs", run["id"], "--tail", "100").stdout == last, "--tail printed other bytes"

    settings = Settings(home=home, database_url="", ssh_config=server.config)
    options = options_for(settings)
    backend = SshHostProcessBackend(NoHosts(), options)
    spec = HostSpec(name="bench-host", ssh=server.alias)

    def cold() -> None:
        """Every figure on a fresh connection: ORBIT's shared one is closed first (untimed)."""
        Ssh(spec, options).close()
        time.sleep(0.2)

    with open(os.devnull, "wb") as devnull:

        def stream() -> None:
            end = backend.stream_log(handle, LogLayer.TRAINING, 0, devnull.write)
            assert end == log_bytes

        def chunks() -> None:
            offset = 0
            while True:
                data, offset = backend.read_log(handle, LogLayer.TRAINING, offset)
                if not data:
                    break
                devnull.write(data)
            assert offset == log_bytes

        actions: dict[str, Callable[[], object]] = {
            "ssh_cat": lambda: subprocess.run(
                server.ssh_argv("cat", str(path)), stdout=subprocess.DEVNULL, check=True
            ),
            "orbit_logs": lambda: orbit("logs", run["id"], stdout=subprocess.DEVNULL),
            "stream": stream,
            "chunks": chunks,
            "cli_start": lambda: orbit("--version", stdout=subprocess.DEVNULL),
            "ssh_tail": lambda: subprocess.run(
                server.ssh_argv("tail", "-n", "100", str(path)),
                stdout=subprocess.DEVNULL,
                check=True,
            ),
            "orbit_tail": lambda: orbit(
                "logs", run["id"], "--tail", "100", stdout=subprocess.DEVNULL
            ),
        }
        seconds: dict[str, list[float]] = {name: [] for name in actions}
        for _ in range(repeat):
            for name, action in actions.items():
                cold()
                started = time.perf_counter()
                action()
                seconds[name].append(time.perf_counter() - started)
    reference = statistics.median(seconds["ssh_cat"])
    report: dict[str, object] = {"log_bytes": log_bytes, "repeat": repeat}
    for name, taken in seconds.items():
        median = statistics.median(taken)
        against = statistics.median(seconds["ssh_tail"]) if name == "orbit_tail" else reference
        report[name] = {"seconds": median, "ratio": median / against, "all": taken}
    return report


if __name__ == "__main__":
    sys.exit(main())

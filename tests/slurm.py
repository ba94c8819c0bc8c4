"""A real, private Slurm for the Slurm backend's tests: one per test session.

munged, slurmctld and two slurmd are started here, each in the foreground of a process this
module owns, with a private slurm.conf, state, spool, logs and munge socket and key in a
temporary folder (never /etc/slurm, never the machine's munged), on free loopback ports. Node
`node1` has two fake GPUs of type a100: gres.conf points at character devices made with mknod
(copies of /dev/null), so `--gres=gpu:a100:2` is accounted for as on a real node. `node2` is
a second slurmd on this same machine (its own port and spool, two GPUs of its own), so that a
job of two nodes runs as on a real cluster: srun, one task per node.

Partitions: `debug` (the default, no time limit), `short` (MaxTime 5 minutes) and `proj`
(AllowAccounts=proj42: another account is refused at submit, as a site's QOS or association
would be), all of node1 only, and `multi` (node1 and node2). Jobs see SLURM_CONF: pass
`slurm.env` (or the cluster's --slurm-conf) to commands.

Teardown stops exactly the daemons started here, by their process, after cancelling every job
of this private cluster (nothing else submits to it). A session killed before its teardown
leaves a folder whose owner pid is dead: the next session stops the daemons that name that
folder on their command line and removes it.

slurmctld, slurmd, munged or mknod missing, or not root: skipped, or failed where
ORBIT_REQUIRE_SLURM=1 (CI).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

PREFIX = "orbit-test-slurm-"
GPU_TYPE = "a100"
CPUS = 8
MEMORY_MB = 8000
GRES = f"gpu:{GPU_TYPE}:2"
NODES = ("node1", "node2")
START_TIMEOUT_S = 60.0


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("ORBIT_REQUIRE_SLURM") == "1":
        pytest.fail(f"Slurm is required (ORBIT_REQUIRE_SLURM=1) but {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    version: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def sbatch(self, *args: str) -> str:
        """A bare job (not ORBIT's), its id."""
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", *args).stdout
        return out.strip().split(";")[0]

    def queue(self) -> list[str]:
        """Ids of the jobs pending, running or completing."""
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return ""

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for a condition of the cluster; a bound so a broken cluster fails, not hangs."""
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                    for p in sorted((self.root / "log").glob("*"))
                )
                raise AssertionError(f"slurm: {what} did not happen\n{logs}")
            time.sleep(0.1)

    def restart_controller(self, while_down: Callable[[], None] = lambda: None) -> None:
        """Stop slurmctld (its state saved, as at any restart), call `while_down`, start it
        again from its state, and wait until it answers and the node is back."""
        old = next(p for p in self.procs if "slurmctld" in str(p.args))
        old.send_signal(signal.SIGTERM)
        old.wait(30)
        self.procs.remove(old)
        while_down()
        self._daemon(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        self.procs.insert(1, self.procs.pop())  # stopped in order: slurmd, slurmctld, munged
        self.wait(
            "scontrol ping UP", lambda: "UP" in self.run("scontrol", "ping", check=False).stdout
        )
        self.wait("the node back", lambda: self.node_state() in ("idle", "mixed", "allocated"))

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-n", NODES[0], "-o", "%T").stdout.strip()

    def set_node(self, state: str, reason: str = "orbit test", node: str = NODES[0]) -> None:
        self.run("scontrol", "update", f"nodename={node}", f"state={state}", f"reason={reason}")

    def cancel_all(self) -> None:
        """Every job of this private cluster (only tests submit to it), then an empty queue."""
        self.run("scancel", "--quiet", "--user=root", check=False)
        self.wait("an empty queue", lambda: not self.queue())

    # --- start and stop -------------------------------------------------------------------

    def _daemon(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        out = (self.root / "log" / f"{name}.out").open("ab")
        proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        d = self.root
        d.chmod(0o711)
        for sub in ("state", "spool", "log", "munge", "dev"):
            (d / sub).mkdir()
        (d / "owner").write_text(str(os.getpid()))
        (d / "munge").chmod(0o711)  # munged checks its socket's folder
        key = d / "munge" / "key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge" / "sock"
        self._daemon(
            [
                "munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                f"--pid-file={d / 'munge' / 'pid'}", f"--log-file={d / 'log' / 'munged.log'}",
                f"--seed-file={d / 'munge' / 'seed'}",
            ],
            "munged",
        )  # fmt: skip
        self.wait("munged's socket", sock.exists)
        for i in range(4):  # fake GPUs: character devices, as /dev/null is
            subprocess.run(["mknod", str(d / "dev" / f"nvidia{i}"), "c", "1", "3"], check=True)
        (d / "gres.conf").write_text(
            "AutoDetect=off\n"
            f"NodeName={NODES[0]} Name=gpu Type={GPU_TYPE} File={d}/dev/nvidia[0-1]\n"
            f"NodeName={NODES[1]} Name=gpu Type={GPU_TYPE} File={d}/dev/nvidia[2-3]\n"
        )
        node = f"CPUs={CPUS} RealMemory={MEMORY_MB} Gres={GRES} State=UNKNOWN"
        self.conf.write_text(
            f"""\
ClusterName=orbittest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=error
SlurmdDebug=error
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=5
MinJobAge=600
EnforcePartLimits=ALL
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1
GresTypes=gpu
NodeName={NODES[0]} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} {node}
NodeName={NODES[1]} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} {node}
PartitionName=debug Nodes={NODES[0]} Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes={NODES[0]} MaxTime=5 State=UP
PartitionName=proj Nodes={NODES[0]} MaxTime=INFINITE AllowAccounts=proj42 State=UP
PartitionName=multi Nodes={",".join(NODES)} MaxTime=INFINITE State=UP
""",
            encoding="utf-8",
        )
        self._daemon(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        self.wait(
            "scontrol ping UP", lambda: "UP" in self.run("scontrol", "ping", check=False).stdout
        )
        for name in NODES:
            (d / "spool" / name).mkdir()
            self._daemon(["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}")
        nodes = ("sinfo", "-h", "-N", "-o", "%T")
        self.wait(
            "the nodes idle",
            lambda: set(self.run(*nodes, check=False).stdout.split()) == {"idle"},
        )
        self.version = self.run("sbatch", "--version").stdout.split()[-1]
        # the controller's first scheduling pass comes a little after its start: one job
        # through it, so that no test's first job waits on that
        self.sbatch("-J", "warmup", "--wrap", "true")
        self.wait("the warm-up job to end", lambda: not self.queue())

    def stop(self) -> None:
        if self.procs and self.procs[-1].poll() is None:
            with contextlib.suppress(AssertionError, subprocess.SubprocessError):
                self.cancel_all()  # slurmstepd's end before slurmd goes
        for proc in reversed(self.procs):  # slurmd, slurmctld, then munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _clean_stale() -> None:
    """A folder of an earlier session that died before its teardown: its daemons (and any
    slurmstepd) named on their command line by its path are stopped, the folder removed."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((folder / "owner").read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and psutil.pid_exists(owner):
            continue  # a live session's (another xdist worker's)
        if not owner and time.time() - folder.stat().st_mtime < 60:
            continue  # being made right now
        root = str(folder)
        victims = []
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(root in arg for arg in p.info["cmdline"] or []):
                    victims.append(p)
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(victims, timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        _unavailable("the private Slurm runs its daemons as root")
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "mknod"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            _unavailable(f"{tool} is not installed (apt-get install slurm-wlm munge)")
    _clean_stale()
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    cluster = SlurmCluster(root=root, conf=root / "slurm.conf")
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, its queue empty before and after each test."""
    slurm_cluster.cancel_all()
    yield slurm_cluster
    if slurm_cluster.node_state().startswith(("down", "drain", "fail")):  # a test set it down
        slurm_cluster.set_node("resume")
    slurm_cluster.cancel_all()

"""A real, private Docker daemon for the docker launch mode's tests: one per test session.

`dockerd --bridge=none --iptables=false` with its own data root, exec root and socket, so it
touches neither the machine's Docker (if any) nor its network. No registry is reachable, so the
test image is made here: a rootfs holding a static busybox, `docker import`ed as
`orbit-test/busybox:1` (`orbit-test/busybox:2` differs by one file, for a different image id).

Where dockerd is not installed or cannot start (not root, no cgroups...), the tests that need it
are skipped with the reason; with ORBIT_REQUIRE_DOCKER=1 (CI) they fail instead.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

IMAGE = "orbit-test/busybox:1"
OTHER_IMAGE = "orbit-test/busybox:2"
APPLETS = ("sh", "sleep", "echo", "cat", "ls", "env", "true", "false", "id", "kill", "printf")
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")


@dataclass(frozen=True)
class Dockerd:
    host: str  # the DOCKER_HOST value
    image: str
    other_image: str
    root: Path

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["docker", *args],
            env={**os.environ, "DOCKER_HOST": self.host},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def containers(self, *filters: str) -> list[str]:
        """Names of the containers, running or not, that match every `--filter`."""
        argv = ["ps", "--all", "--format", "{{.Names}}"]
        for f in filters:
            argv += ["--filter", f]
        return self.docker(*argv).stdout.split()

    def image_id(self, ref: str) -> str:
        return self.docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()


def _unavailable(reason: str) -> None:
    if os.environ.get("ORBIT_REQUIRE_DOCKER") == "1":
        pytest.fail(f"Docker is required (ORBIT_REQUIRE_DOCKER=1) but {reason}")
    pytest.skip(reason)


def _rootfs_tar(busybox: str, marker: str) -> bytes:
    """A tar of a minimal root: /bin/busybox, its applets as links, an empty /tmp."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        tar.add(os.path.realpath(busybox), arcname="bin/busybox")
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        data = marker.encode()
        info = tarfile.TarInfo("etc/orbit-test-image")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _wait_ready(host: str, proc: subprocess.Popen[bytes], log: Path) -> str | None:
    """None once the daemon answers, else why not."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"dockerd exited with {proc.returncode}: {log.read_text()[-1500:]}"
        ping = subprocess.run(
            ["docker", "-H", host, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            timeout=10,
        )
        if ping.returncode == 0:
            return None
        time.sleep(0.2)
    return f"dockerd did not answer within 60s: {log.read_text()[-1500:]}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _unmount_under(root: Path) -> None:
    """Whatever a killed daemon left mounted under its folders (overlays, shm), deepest first."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[1] for line in mounts if len(line.split()) > 1]
    for point in sorted((p for p in points if p.startswith(str(root))), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """One private dockerd for the session, with the busybox test images built."""
    binary, cli = shutil.which("dockerd"), shutil.which("docker")
    busybox = next((p for p in BUSYBOX_PATHS if os.access(p, os.X_OK)), None)
    if binary is None or cli is None:
        _unavailable("dockerd or the docker CLI is not installed")
    if busybox is None:
        _unavailable("no busybox to build the test image from (apt install busybox-static)")
    if os.geteuid() != 0:
        _unavailable("dockerd needs root here")
    assert binary is not None and busybox is not None
    # a unix socket path must stay under ~108 bytes: a short folder in /tmp
    root = Path(tempfile.mkdtemp(prefix="orbit-dockerd-", dir="/tmp"))
    host = f"unix://{root}/docker.sock"
    log = root / "dockerd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                f"--data-root={root}/data",
                f"--exec-root={root}/exec",
                f"--pidfile={root}/docker.pid",
                f"--host={host}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        problem = _wait_ready(host, proc, log)
        if problem is not None:
            _unavailable(problem)
        daemon = Dockerd(host=host, image=IMAGE, other_image=OTHER_IMAGE, root=root)
        for ref in (IMAGE, OTHER_IMAGE):
            imported = subprocess.run(
                ["docker", "-H", host, "import", "-", ref],
                input=_rootfs_tar(busybox, ref),
                capture_output=True,
                timeout=60,
            )
            if imported.returncode != 0:
                _unavailable(f"docker import failed: {imported.stderr.decode()[-500:]}")
        smoke = daemon.docker("run", "--rm", "--network", "none", IMAGE, "echo", "ok", check=False)
        if smoke.returncode != 0 or smoke.stdout.strip() != "ok":
            _unavailable(f"the test image does not run (is busybox static?): {smoke.stderr}")
        yield daemon
    finally:
        leftovers = subprocess.run(
            ["docker", "-H", host, "ps", "--all", "--quiet"], capture_output=True, text=True
        ).stdout.split()
        if leftovers and proc.poll() is None:
            subprocess.run(["docker", "-H", host, "rm", "--force", *leftovers], capture_output=True)
        _stop(proc)
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


SYSTEM_PYTHON = "/usr/bin/python3"
PYTHON_IMAGE = "orbit-test/python:1"


def _python_rootfs_tar(busybox: str) -> bytes:
    """The system python3 with the shared libraries it links and its standard library, plus
    busybox's sh: an image whose own interpreter the precheck can run in."""
    python = os.path.realpath(SYSTEM_PYTHON)
    found = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    stdlib = found.stdout.strip()
    linked = subprocess.run(["ldd", python], capture_output=True, text=True, check=True).stdout
    libs = {word for word in linked.split() if word.startswith("/")}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted({python, *libs}):
            tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
        tar.add(stdlib, arcname=stdlib.lstrip("/"), filter=_no_caches)
        tar.add(os.path.realpath(busybox), arcname="bin/sh")
        info = tarfile.TarInfo("usr/bin/python3")
        info.type, info.linkname = tarfile.SYMTYPE, os.path.basename(python)
        tar.addfile(info)
        info = tarfile.TarInfo("tmp")
        info.type, info.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(info)
    return buffer.getvalue()


def _no_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    skip = ("__pycache__", "test", "idlelib", "tkinter", "ensurepip", "site-packages")
    return None if any(part in skip for part in info.name.split("/")) else info


@pytest.fixture(scope="session")
def python_image(dockerd: Dockerd) -> str:
    """An image with a python3 in it (this machine's own, with its libraries), built once."""
    busybox = next((p for p in BUSYBOX_PATHS if os.access(p, os.X_OK)), "/bin/busybox")
    if not os.access(SYSTEM_PYTHON, os.X_OK) or shutil.which("ldd") is None:
        pytest.skip(f"no {SYSTEM_PYTHON} (or ldd) to build a python image from")
    try:
        rootfs = _python_rootfs_tar(busybox)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot gather {SYSTEM_PYTHON} into an image: {exc}")
    imported = subprocess.run(
        ["docker", "-H", dockerd.host, "import", "-", PYTHON_IMAGE],
        input=rootfs,
        capture_output=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr.decode()
    smoke = dockerd.docker("run", "--rm", PYTHON_IMAGE, "python3", "-c", "print(1)", check=False)
    if smoke.stdout.strip() != "1":
        pytest.skip(f"the python image does not run: {smoke.stderr[-500:]}")
    return PYTHON_IMAGE


@pytest.fixture
def docker_host(dockerd: Dockerd, monkeypatch: pytest.MonkeyPatch) -> Dockerd:
    """The private daemon as the standard DOCKER_HOST of this test (and what it starts)."""
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    return dockerd

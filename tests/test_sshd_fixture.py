"""The real-sshd fixtures (tests/sshd.py) do what the SSH backend's tests rely on."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil

from tests.helpers import eventually
from tests.sshd import SshdFactory, SshServer, make_tool_dir


def test_ssh_with_the_generated_config_runs_commands(sshd_server: SshServer) -> None:
    res = sshd_server.run("echo ok")
    assert (res.returncode, res.stdout) == (0, "ok\n"), res.stderr
    # Sessions get a private, empty HOME: no dotfiles of this machine leak into them.
    assert sshd_server.run("echo $HOME").stdout.strip() == str(sshd_server.home)
    line = sshd_server.known_hosts.read_text().strip()
    assert line == f"[127.0.0.1]:{sshd_server.port} {sshd_server.host_key_pub}"


def test_rsync_through_the_config(sshd_server: SshServer, tmp_path: Path) -> None:
    src = tmp_path / "payload.txt"
    src.write_text("hello over rsync\n")
    res = subprocess.run(
        [
            "rsync",
            "-a",
            "-e",
            sshd_server.rsh,
            str(src),
            f"{sshd_server.alias}:{sshd_server.work_root}/",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert (sshd_server.work_root / "payload.txt").read_text() == "hello over rsync\n"


def test_several_hosts_share_one_config(sshd_factory: SshdFactory) -> None:
    a = sshd_factory(alias="h100-a")
    b = sshd_factory(alias="h100-b")
    assert a.config == b.config == sshd_factory.config
    for alias in ("h100-a", "h100-b"):
        res = subprocess.run(
            ["ssh", "-F", str(sshd_factory.config), alias, "echo", alias],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (res.returncode, res.stdout) == (0, f"{alias}\n"), res.stderr
    assert len(sshd_factory.known_hosts.read_text().splitlines()) == 2


def test_unknown_host_key_and_wrong_identity_are_refused(sshd_server: SshServer) -> None:
    res = sshd_server.run("true", config=sshd_server.unknown_host_key_config())
    assert res.returncode == 255
    assert "Host key verification failed" in res.stderr
    res = sshd_server.run("true", config=sshd_server.wrong_identity_config())
    assert res.returncode == 255
    assert "Permission denied" in res.stderr


def test_a_host_without_python(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    path = make_tool_dir(tmp_path / "bare-bin")
    server = sshd_factory(path=path)
    res = server.run("sh -c 'command -v python3'")
    assert res.returncode != 0 and res.stdout == "", res  # dash says 127, bash 1
    assert server.run("echo $PATH").stdout.strip() == path
    assert server.run("command -v rsync").stdout.strip() == f"{path}/rsync"


def test_stop_kills_what_sessions_left_behind_and_start_brings_it_back(
    sshd_server: SshServer,
) -> None:
    # A daemonized process (new session, reparented away from sshd) with cwd in work_root.
    work = sshd_server.work_root
    res = sshd_server.run(f"cd {work}; setsid nohup sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout)
    assert psutil.pid_exists(pid)
    assert sshd_server.stop() == []
    eventually(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie")
    assert sshd_server.run("true").returncode == 255  # connection refused
    sshd_server.start()
    assert sshd_server.run("echo back").stdout == "back\n"


def test_netns_link_down_makes_the_host_unreachable_until_link_up(
    sshd_factory: SshdFactory,
) -> None:
    server = sshd_factory(netns=True, alias="gpu-box")
    assert server.netns is not None and server.port == 22
    assert server.run("echo ok").stdout == "ok\n"

    server.link_down()
    started = time.monotonic()
    res = server.run("echo ok", timeout=30)
    elapsed = time.monotonic() - started
    assert res.returncode == 255, res
    assert "timed out" in res.stderr, res.stderr  # a stall, not a refusal
    assert elapsed < 10, elapsed  # ConnectTimeout 3

    server.link_up()
    res = server.run("echo ok")
    assert (res.returncode, res.stdout) == (0, "ok\n"), res.stderr


def test_netns_link_down_breaks_a_live_control_master(
    sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(netns=True)
    control = tmp_path / "cm"
    mux = ["-o", f"ControlPath={control}", "-o", "ControlMaster=auto", "-o", "ControlPersist=60"]
    res = subprocess.run(
        ["ssh", "-F", str(server.config), *mux, server.alias, "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert control.exists()

    server.link_down()
    started = time.monotonic()
    # A long command over the existing connection: ServerAlive (1 s x 3) ends it.
    res = subprocess.run(
        ["ssh", "-F", str(server.config), *mux, server.alias, "sleep 60"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert res.returncode == 255, res
    assert elapsed < 15, elapsed  # ~3.6 s of ServerAlive, then a 3 s ConnectTimeout retry

"""How the runtime wrapper stops an attempt's task, and what it stops after the task's end.

SIGTERM (or SIGINT, SIGHUP) asks for a graceful stop: the task's process group gets SIGTERM,
then SIGKILL after the job's stop_grace_s. runtime/stop_request.json, if present, says why. An
attempt whose agent has been cut off from its control plane past its fence stops the same way
(node_lost): the control plane has given it up and retries it elsewhere.

Nothing of an ended attempt keeps running: when the task ends (success, failure, stop), every
process still carrying the attempt's marker in its environment (ORBIT_ATTEMPT_ID, inherited by
whatever the task starts, also what left its process group: setsid, tensorboard, `vllm
serve`) gets SIGTERM, then SIGKILL after the grace period, before the manifest and result are
written.

It travels inside the bundle beside the wrapper (scripts/orbit_stopping.py) and needs nothing
but python3's standard library; each function takes the wrapper (`w`) whose attempt it stops.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # as mypy reads them
    from orbit.runtime import records, sidecars
else:
    try:  # in a bundle: beside this file in scripts/
        import orbit_records as records
        import orbit_sidecars as sidecars
    except ImportError:  # as part of the orbit package
        from orbit.runtime import records, sidecars

MARKER = "ORBIT_ATTEMPT_ID"  # in the environment of everything an attempt starts
FENCE_SLACK_S = 5.0  # a wrapper stops its task this long after its agent would have


class Wrapper(Protocol):
    """What a stop reads and sets of the wrapper (orbit.runtime.wrapper.Wrapper): named here,
    so that this module does not import the one that imports it."""

    bundle: str
    runtime: str
    grace: float
    stop_at: float | None
    signal_reason: str
    docker: Any
    launcher_pid: int

    def log(self, message: str) -> None: ...

    def signal_task(self, sig: int) -> None: ...


def on_signal(w: Wrapper, signum: int, _frame: Any) -> None:
    """The wrapper's handler of SIGTERM, SIGINT and SIGHUP."""
    if w.stop_at is not None:
        return
    # a stop ORBIT asked for may give less than the job's grace (a node cut off from its
    # control plane: its retry elsewhere must not find it still running)
    request = sidecars.read_json(os.path.join(w.runtime, "stop_request.json")) or {}
    with contextlib.suppress(TypeError, ValueError, KeyError):
        w.grace = min(w.grace, max(0.0, float(request["grace_s"])))
    # INT and HUP are a person at (or closing) a terminal; a TERM that ORBIT did not explain
    # in runtime/stop_request.json is the machine going away: spot preemption, shutdown.
    why = "preempted" if signum == signal.SIGTERM else "cancelled"
    stop(w, why, f"received {signal.Signals(signum).name}")


def stop(w: Wrapper, reason: str, why: str) -> None:
    """Stop the task gracefully: SIGTERM now, SIGKILL once its grace is over."""
    margin = w.docker.stop_margin_s if w.docker is not None else 0.0
    w.stop_at = time.monotonic() + w.grace + margin  # docker stop kills at the grace
    w.signal_reason = reason
    w.log(f"{why}: stopping the task (grace {w.grace}s)")
    w.signal_task(signal.SIGTERM)


def agent_gone() -> float | None:
    """How long this attempt's agent has been without word from its control plane, once
    that is past the fence it was started with (orbit.agent.fencing): the control plane
    has given the attempt up and retries it elsewhere. None otherwise, and where no agent
    started it."""
    contact = os.environ.get("ORBIT_AGENT_CONTACT")
    limit = os.environ.get("ORBIT_FENCE_AFTER_S")
    if not contact or not limit:
        return None
    try:
        silent = time.time() - os.stat(contact).st_mtime
        fence = float(limit) + FENCE_SLACK_S
    except (OSError, ValueError):
        return None
    return silent if silent > fence else None


def fence(w: Wrapper) -> None:
    """Stop the task (node_lost) if its agent has been cut off past its fence."""
    silent = agent_gone()
    if silent is None:
        return
    with contextlib.suppress(OSError, ValueError):
        w.grace = min(w.grace, float(os.environ.get("ORBIT_FENCE_STOP_S", w.grace)))
    why = (
        f"its agent has had no word from the control plane for {silent:.0f}s, which has "
        "given this attempt up and retries it elsewhere"
    )
    records.write_json(
        os.path.join(w.runtime, "stop_request.json"),
        {"reason": "node_lost", "at": records.now(), "message": why},
    )
    stop(w, "node_lost", why)


def asked(w: Wrapper) -> bool:
    """Whether ORBIT has asked this attempt to stop (a rerun's old request is gone: see
    Wrapper.take_lock)."""
    return os.path.exists(os.path.join(w.runtime, "stop_request.json"))


def reason(w: Wrapper) -> str:
    """Why the attempt was stopped: as its stop request says, else as the signal said."""
    request = sidecars.read_json(os.path.join(w.runtime, "stop_request.json")) or {}
    return str(request.get("reason", w.signal_reason))


def stop_leftovers(w: Wrapper) -> None:
    """SIGTERM, then after the grace period SIGKILL, every process that still carries this
    attempt's marker: what the task started outside its process group. An attempt run by
    hand is "manual", like every other run by hand, so its bundle must match too."""
    marks = [f"{MARKER}={os.environ.get(MARKER, 'manual')}"]
    if MARKER not in os.environ:
        marks.append(f"ORBIT_BUNDLE_DIR={w.bundle}")
    if int(os.environ.get("ORBIT_NUM_NODES") or 1) > 1:  # a rank of a run across nodes:
        # its own processes, not its peers' where two ranks share a host
        marks.append(f"ORBIT_NODE_RANK={os.environ.get('ORBIT_NODE_RANK', '0')}")
    if TYPE_CHECKING:
        from orbit.runtime import host_processes
    else:
        try:  # beside this file in scripts/ (imported here: only an attempt's end needs it)
            import orbit_host_processes as host_processes
        except ImportError:  # as part of the orbit package
            from orbit.runtime import host_processes

    keep = {w.launcher_pid, *host_processes.ourselves()}
    try:
        stopped = host_processes.stop_processes(lambda: host_processes.marked(marks, keep), w.grace)
    except OSError as exc:  # no /proc (not Linux): the process group was all there was
        w.log(f"cannot look for leftover processes: {exc}")
        return
    if stopped:
        w.log(
            f"stopped {len(stopped)} leftover process(es) of the attempt that had left the "
            f"task's process group: {', '.join(map(str, stopped))}"
        )

"""The agent protocol: every message between `orbit server` and `orbit agent`, in one place.

The agent only ever connects out. It registers once with a join token and keeps the node
credential it gets; then, over plain HTTPS requests it makes itself:

- `sync` on every (re)connect: what it runs; the answer is what it should run, and what to stop.
- `poll`, a long-poll held open: commands for it (start, cancel, fetch/upload files, resync),
  each with a unique id, redelivered until acknowledged by id in a later poll.
- `claim` before it starts an attempt: the fencing check. The server grants an attempt's start
  once, to the node it was placed on, under the fence the start command carries.
- `heartbeat` every few seconds: liveness, and its node info when that changed.
- `report`: numbered reports of its attempts' files (logs by byte offset, status and result
  files whole), so a resend changes nothing and a gap is asked for again.
- `bundle/{digest}`: a bundle's archive, fetched once per digest and cached on the node.

A change that an older peer would misread bumps PROTOCOL_VERSION; both sides refuse a peer
that speaks another.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orbit.wire.leftout import LeavesOutEmpty

# 2: accelerators carry their health; a start may carry a resume and carries its max_tasks
# 4: the server says when a node cut off from it stops its attempts (fence_after_s) and which
#    of them to stop but keep uploading (halt); a report names the attempts it has no folder of
#    and the `remove` command (attempts' folders of deleted or expired runs)
# 5: a heartbeat carries each GPU's utilization as NVML last measured it (gpu_utilization)
PROTOCOL_VERSION = 5
PREFIX = "/api/v1/agent"
VERSION_HEADER = "X-Orbit-Agent-Protocol"
REGISTER_PATH = PREFIX + "/register"
CANCELLED_BEFORE_START = "cancelled before it started"

# what one report may carry, and one chunk of one file in it
MAX_REPORT_BYTES = 8 << 20
MAX_CHUNK_BYTES = 1 << 20
MAX_LABELS = 64
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
LABEL_VALUE = re.compile(r"[A-Za-z0-9._/:-]{0,63}")
# an attempt's files as the bundle lays them out: runtime/... and artifacts/..., nothing else
FILE_PATH = r"^(runtime|artifacts)/[^\x00]{1,1000}$"
SHA256 = r"^[0-9a-f]{64}$"
# ids the server made (orbit.store.base.new_id): checked on every message, since a node's ids
# name folders on both sides and must never lead out of them
ATTEMPT_ID = r"^[A-Za-z0-9_-]{1,64}(\.r[0-9]{1,4})?$"  # a gang's rank R: ATTEMPT.rR
# a file transfer's id (`orbit nodes push/pull`: the command's own id, orbit.core.control.nodes)
TRANSFER_ID = r"^cmd-[0-9a-f]{32}$"
AttemptId = Annotated[str, Field(pattern=ATTEMPT_ID)]
TransferId = Annotated[str, Field(pattern=TRANSFER_ID)]


class Message(BaseModel):
    """Unknown fields are refused: a peer that sends what this side does not know is a peer
    of another version, and is told so rather than half understood."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- what a node has (the unified resource descriptor) ------------------------------------


class Accelerator(Message):
    index: int = Field(ge=0)
    uuid: str = ""
    model: str = ""
    memory_mb: int = Field(default=0, ge=0)
    vendor: str = "nvidia"
    # indices of the accelerators this one is linked to by NVLink, where NVML tells
    nvlink_peers: tuple[int, ...] = ()
    # NVML's last word on it: uncorrected ECC errors since its last reset, fallen off the bus,
    # or an XID seen since the agent started (orbit.agent.xids). An unhealthy one gets no work
    # until the node reports it healthy again.
    healthy: bool = True
    problem: str = Field(default="", max_length=200)


class NodeInfo(Message):
    """What a node reports at start and whenever it changes."""

    agent_version: str
    protocol: int = PROTOCOL_VERSION
    hostname: str = ""
    # where the node's peers reach it (orbit agent --address): a gang's rank 0 is its master
    address: str = Field(default="", max_length=255)
    accelerators: tuple[Accelerator, ...] = ()
    accelerator_source: str = ""  # how they were found ("nvml", "nvml: not found", ...)
    cpus: int = Field(default=0, ge=0)
    memory_mb: int = Field(default=0, ge=0)
    disk_free_mb: int = Field(default=0, ge=0)  # in the agent's work dir
    docker: bool = False
    nvidia_runtime: bool = False
    cached_models: tuple[str, ...] = ()
    cached_datasets: tuple[str, ...] = ()
    # model servers running on the node, name -> URL: `http` tasks ask for them by name
    services: dict[str, str] = Field(default={}, max_length=64)


Labels = Annotated[dict[str, str], Field(max_length=MAX_LABELS)]


def parse_service(text: str) -> tuple[str, str]:
    """`NAME=URL` (orbit agent --service) as (name, url); ValueError saying what is expected."""
    from urllib.parse import urlsplit

    name, sep, url = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", name):
        raise ValueError(f"expected NAME=URL (e.g. vllm=http://127.0.0.1:8000), got {text!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name}: expected an http:// or https:// URL, got {url!r}")
    return name, url.rstrip("/")


# --- registration -----------------------------------------------------------------------------


class RegisterRequest(Message):
    join_token: str = Field(min_length=1, max_length=200)
    name: str = Field(pattern=NODE_NAME)
    labels: Labels = {}
    max_tasks: int = Field(default=1, ge=0, le=1024)
    info: NodeInfo


class RegisterResponse(Message):
    node_id: str
    name: str
    credential: str  # shown once; the server keeps its sha256 only
    heartbeat_s: float
    protocol: int = PROTOCOL_VERSION


# --- what a node runs -------------------------------------------------------------------------


class RunningAttempt(Message):
    attempt_id: AttemptId
    fence: int = Field(ge=0)
    alive: bool  # its wrapper still runs
    ended: bool = False  # its result is written (it may still be uploading)


class SyncRequest(Message):
    node_id: str
    session: str = Field(min_length=1, max_length=64)  # new on every agent start
    running: tuple[RunningAttempt, ...] = ()
    info: NodeInfo | None = None


class Assignment(Message):
    """An attempt the node should run, or keep uploading."""

    attempt_id: AttemptId
    fence: int


class SyncResponse(Message):
    keep: tuple[Assignment, ...]  # go on with these
    stop: tuple[str, ...]  # stop and clean up these: the server does not know them
    lost: tuple[str, ...]  # the server expected these and the node lacks them: marked lost
    heartbeat_s: float
    max_tasks: int
    # given up on (lost) while the node was away but still running: stop them, and go on
    # uploading their files (a checkpoint a retry resumes from, what collect asks for)
    halt: tuple[str, ...] = ()
    # a node that has heard nothing from the server for this long stops its attempts (the
    # server has given them up by then, and retries them elsewhere); None: never
    fence_after_s: float | None = None


# --- commands ---------------------------------------------------------------------------------


class Resume(Message):
    """An earlier attempt's checkpoint for a start: `relpath` under its artifacts, and its
    files (paths under the attempt's folder) as the control plane's copy has them. The node
    copies them from its own folder of that attempt when it has one, else fetches them."""

    attempt_id: AttemptId
    relpath: str = Field(min_length=1, max_length=1000)
    files: tuple[tuple[str, int], ...] = ()  # (artifacts/..., size)


class Gang(Message):
    """A start's place in a gang (a run across several nodes, num_nodes): the task gets it as
    ORBIT_NODE_RANK, ORBIT_NUM_NODES, ORBIT_MASTER_ADDR and ORBIT_MASTER_PORT."""

    rank: int = Field(ge=0)
    num_nodes: int = Field(ge=2)
    master_addr: str = Field(min_length=1, max_length=255)
    master_port: int = Field(ge=1, le=65535)


class StartAttempt(Message):
    kind: Literal["start"] = "start"
    run_id: str
    attempt_id: AttemptId
    fence: int = Field(ge=1)
    bundle_digest: str = Field(pattern=SHA256)
    request: dict[str, Any]  # orbit.model.models.ExecutionRequest
    gpu_indices: tuple[int, ...] = ()
    upload_large: bool = True  # checkpoints too, or only when `orbit collect` asks
    resume: Resume | None = None  # go on from an earlier attempt's checkpoint
    # the node's max_tasks the placement was checked against (newer than a heartbeat's)
    max_tasks: int | None = Field(default=None, ge=0)
    gang: Gang | None = None  # one node of a run across several


class CancelAttempt(Message):
    kind: Literal["cancel"] = "cancel"
    attempt_id: AttemptId
    fence: int = Field(default=0, ge=0)  # to refuse its start, when it has not started yet
    reason: str = "cancelled"


class UploadFiles(Message):
    """Upload everything of an attempt now, large files too (`orbit collect`)."""

    kind: Literal["upload"] = "upload"
    attempt_id: AttemptId


class PutFile(Message):
    """Fetch a file the server holds (`orbit nodes push`) and write it under the work dir."""

    kind: Literal["put_file"] = "put_file"
    transfer_id: TransferId
    dest: str = Field(min_length=1, max_length=4096)
    sha256: str = Field(pattern=SHA256)
    size: int = Field(ge=0)


class GetFile(Message):
    """Upload a file from under the work dir (`orbit nodes pull`)."""

    kind: Literal["get_file"] = "get_file"
    transfer_id: TransferId
    path: str = Field(min_length=1, max_length=4096)


class Resync(Message):
    kind: Literal["resync"] = "resync"


class RemoveAttempts(Message):
    """Remove these attempts' folders from the work dir (their runs deleted, their artifacts
    expired): whatever their age or uploads, but never one that still runs."""

    kind: Literal["remove"] = "remove"
    attempt_ids: tuple[AttemptId, ...] = Field(min_length=1, max_length=10_000)


CommandBody = Annotated[
    StartAttempt | CancelAttempt | UploadFiles | PutFile | GetFile | Resync | RemoveAttempts,
    Field(discriminator="kind"),
]


class Command(Message):
    id: str
    seq: int
    body: CommandBody


class PollRequest(Message):
    node_id: str
    session: str = Field(min_length=1, max_length=64)
    acks: tuple[str, ...] = Field(default=(), max_length=1000)
    wait_s: float = Field(default=25.0, ge=0, le=60)


class PollResponse(Message):
    commands: tuple[Command, ...] = ()
    # an ack of a command id neither side expects: both drop their queues and sync again; or
    # the node was offline: sync again
    resync: bool = False


# --- the fencing check ------------------------------------------------------------------------


class ClaimRequest(Message):
    node_id: str
    attempt_id: AttemptId
    fence: int = Field(ge=1)
    # the agent will not start it (at capacity, or the bundle would not stage): why
    refuse: str | None = Field(default=None, max_length=2000)


class ClaimResponse(Message, LeavesOutEmpty):
    # without secrets, neither key: an agent of the protocol before them reads it
    LEFT_OUT_EMPTY = ("secrets", "secrets_error")
    granted: bool
    why: str = ""
    # granted a start of a run with secrets: their values for this attempt alone (env name
    # -> value), for the wrapper's stdin; or why they could not be had (the start fails)
    secrets: dict[str, str] = Field(default_factory=dict, repr=False)
    secrets_error: str | None = None


# --- liveness ---------------------------------------------------------------------------------


class HeartbeatRequest(Message):
    node_id: str
    session: str = Field(min_length=1, max_length=64)
    info: NodeInfo | None = None  # when it changed since the last one sent
    # GPU index -> percent of the last sample period a kernel ran (NVML's utilization.gpu),
    # for the fleet's dashboards (/metrics); {} where NVML has none to give
    gpu_utilization: dict[int, Annotated[float, Field(ge=0, le=100)]] = Field(
        default={}, max_length=64
    )


class HeartbeatResponse(Message):
    heartbeat_s: float
    max_tasks: int
    state: str
    # the node was offline (silent past the timeout): sync again, so that what the server gave
    # up on meanwhile is stopped
    resync: bool = False
    fence_after_s: float | None = None  # as in SyncResponse


# --- reports ----------------------------------------------------------------------------------


class FileChunk(Message):
    """Bytes of one of an attempt's files from `offset`. `replace`: the file was rewritten
    (status.json): these bytes are all of it. `sha256` with `size`: the file is complete at
    that size, and the server checks the whole of it."""

    path: str = Field(pattern=FILE_PATH)
    offset: int = Field(ge=0)
    data: str = ""  # base64
    replace: bool = False
    size: int | None = Field(default=None, ge=0)
    sha256: str | None = Field(default=None, pattern=SHA256)


class AttemptReport(Message):
    attempt_id: AttemptId
    fence: int = Field(ge=1)
    alive: bool  # its wrapper still runs
    ended: bool = False  # its result is written (the wrapper may still be exiting)
    done: bool = False  # every file of it is uploaded, and sealed
    chunks: tuple[FileChunk, ...] = ()


class Report(Message):
    node_id: str
    session: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=1)
    attempts: tuple[AttemptReport, ...] = ()
    # attempts the server asked for (an upload for `orbit collect`) that this node has no
    # folder of: their files will never come from here
    missing: tuple[AttemptId, ...] = ()


class Want(Message):
    """The server's copy of `path` ends at `offset`: send from there (a gap, or a bad sha)."""

    attempt_id: AttemptId
    path: str
    offset: int


class ReportResponse(Message):
    seq: int  # the highest applied
    wants: tuple[Want, ...] = ()
    forget: tuple[str, ...] = ()  # attempts the server no longer wants reports of
    # attempts the server has ended (lost, say) that still run: stopped; their files go on
    stop: tuple[str, ...] = ()


# --- file transfers ---------------------------------------------------------------------------


class TransferDone(Message):
    node_id: str
    transfer_id: TransferId
    error: str | None = Field(default=None, max_length=2000)
    data: str = ""  # base64, for get_file
    sha256: str | None = Field(default=None, pattern=SHA256)


def labels_problem(labels: dict[str, str]) -> str | None:
    """Why labels are malformed, or None."""
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key):
            return f"label key '{key}': use letters, digits, '.', '_', '/' or '-' (at most 63)"
        if not LABEL_VALUE.fullmatch(value):
            return f"label '{key}' value '{value}': use letters, digits, '.', '_', '/', ':' or '-'"
    return None


def parse_labels(text: str) -> dict[str, str]:
    """`k=v,k2=v2` -> dict; ValueError naming the bad part."""
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"'{part}': write labels as key=value,key2=value2")
        labels[key.strip()] = value.strip()
    problem = labels_problem(labels)
    if problem:
        raise ValueError(problem)
    return labels

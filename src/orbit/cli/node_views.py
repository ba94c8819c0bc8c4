"""How a node reads in `orbit nodes list` and `show`: its condition, its GPUs, memory and
labels in words, a table of nodes and one node's page (and its JSON)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orbit.cli.common import console
from orbit.cli.text import Table, paint

if TYPE_CHECKING:
    from orbit.model.nodes import NodeRecord


def utc_now() -> datetime:
    return datetime.now(UTC)


def condition(node: NodeRecord, now: datetime | None = None) -> str:
    """As the control plane that gave the record judges it (its offline timeout, not this
    shell's)."""
    return node.condition(now or utc_now())


def node_json(node: NodeRecord, now: datetime | None = None) -> dict[str, Any]:
    now = now or utc_now()
    data = node.model_dump(mode="json")
    data["condition"] = condition(node, now)
    data["online"] = node.online(now)
    return data


def gpus_cell(info: dict[str, Any]) -> str:
    """`0`, `8x H100 80GB HBM3`, or `4x A100, 2x L4` for a mixed node."""
    gpus = list(info.get("accelerators") or ())
    if not gpus:
        return "0"
    models = Counter(str(g.get("model") or "").removeprefix("NVIDIA ").strip() for g in gpus)
    if set(models) == {""}:
        return str(len(gpus))
    return ", ".join(f"{n}x {model or '?'}" for model, n in models.items())


def mib(value: Any) -> str:
    megabytes = int(value or 0)
    if not megabytes:
        return "?"
    if megabytes >= 1024 * 1024:
        return f"{megabytes / 1024 / 1024:.1f} TiB"
    if megabytes >= 10 * 1024:
        return f"{megabytes / 1024:.0f} GiB"
    return f"{megabytes / 1024:.1f} GiB" if megabytes >= 1024 else f"{megabytes} MiB"


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def seen(node: NodeRecord) -> str:
    from orbit.cli.render import ago

    return "never" if node.last_seen_at is None else ago(node.last_seen_at)


CONDITION_STYLE = {"ready": "green", "busy": "cyan", "offline": "red", "revoked": "red"}


def reason_text(node: NodeRecord) -> str:
    """Why it is out of service and who said so: `disk swap (alice)`; `-` for none."""
    if node.reason is None:
        return "-"
    return f"{node.reason} ({node.reason_by})" if node.reason_by else node.reason


def nodes_table(nodes: list[NodeRecord]) -> Table:
    now = utc_now()
    table = Table(
        "NAME", "CONDITION", "RUNNING", "GPUS", "CPUS", "MEM", "LAST SEEN", "LABELS", "REASON"
    )
    for node in nodes:
        said = condition(node, now)
        table.add_row(
            node.name,
            paint(said, CONDITION_STYLE.get(said, "yellow")),
            f"{len(node.running)}/{node.max_tasks}",
            gpus_cell(node.info),
            str(node.info.get("cpus") or "?"),
            mib(node.info.get("memory_mb")),
            seen(node),
            labels_text(node.labels),
            reason_text(node),
        )
    return table


def show_node(node: NodeRecord) -> None:
    info = node.info
    now = utc_now()
    said = condition(node, now)
    console.print(f"{paint(node.name, 'bold')}  {node.id}  {said}")
    agent = str(info.get("agent_version") or "?")
    if info.get("protocol") is not None:
        agent += f" (protocol {info['protocol']})"
    if info.get("hostname"):
        agent += f" on {info['hostname']}"
    docker = "yes" if info.get("docker") else "no"
    rows = [
        ("state", f"{node.state.value}, at most {node.max_tasks} attempt(s) at once"),
        ("running", f"{len(node.running)}/{node.max_tasks}" + _listed(node.running, ": ")),
        ("reason", reason_line(node)),
        ("labels", labels_text(node.labels)),
        (
            "last seen",
            "never"
            if node.last_seen_at is None
            else f"{seen(node)} ({node.last_seen_at:%Y-%m-%d %H:%M:%S} UTC)",
        ),
        ("joined", f"{node.created_at:%Y-%m-%d %H:%M} UTC with {node.created_by}"),
        ("agent", agent),
        ("cpus", str(info.get("cpus") or "?")),
        ("memory", mib(info.get("memory_mb"))),
        ("disk free", f"{mib(info.get('disk_free_mb'))} in the agent's work dir"),
        ("docker", f"{docker}, nvidia runtime {'yes' if info.get('nvidia_runtime') else 'no'}"),
        ("cached models", ", ".join(info.get("cached_models") or ()) or "-"),
        ("cached datasets", ", ".join(info.get("cached_datasets") or ()) or "-"),
    ]
    gpus = list(info.get("accelerators") or ())
    source = f" (found by {info['accelerator_source']})" if info.get("accelerator_source") else ""
    rows.append(("gpus", f"{gpus_cell(info)}{source}"))
    for label, value in rows:
        console.print(f"  {label + ':':<17}{value}")
    for gpu in gpus:
        index = int(gpu.get("index", -1))
        used = node.gpus_in_use.get(index)
        use = "free" if used is None else "in use" if used == 0 else f"{used:g} GB reserved"
        peers = ",".join(str(p) for p in gpu.get("nvlink_peers") or ()) or "-"
        console.print(
            f"    {index}  {gpu.get('model') or '?'}  {mib(gpu.get('memory_mb'))}  "
            f"uuid {gpu.get('uuid') or '?'}  nvlink peers {peers}  {use}"
        )


def reason_line(node: NodeRecord) -> str:
    if node.reason is None:
        return "-"
    at = f", {node.reason_at:%Y-%m-%d %H:%M} UTC" if node.reason_at else ""
    return f"{node.reason} (by {node.reason_by or '?'}{at})"


def _listed(items: tuple[str, ...], lead: str) -> str:
    return lead + ", ".join(items) if items else ""

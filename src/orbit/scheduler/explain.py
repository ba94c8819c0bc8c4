"""Decisions in words. The checks give reasons and figures; the sentences are made here, for
`orbit explain`, `orbit queue` and the message a waiting run shows, and nowhere else."""

from __future__ import annotations

from typing import Any

# reason -> (words, how its figures read); order: how a person reads down the list
_WORDS: dict[str, str] = {
    "target": "not the target",
    "selector": "labels",
    "gpu_model": "gpu model",
    "gpu_memory": "gpu memory",
    "gpu_count": "too few gpus",
    "cpu_total": "too few cpus",
    "memory_total": "too little ram",
    "revoked": "revoked",
    "cordoned": "cordoned",
    "draining": "draining",
    "offline": "offline",
    "unhealthy": "unhealthy gpu",
    "slots": "full",
    "gpus_busy": "gpus busy",
    "cpus_busy": "cpus busy",
    "memory_busy": "ram busy",
    "disk": "disk",
    "reserved": "reserved",
    "plugin": "site check",
}


_ORDER = {reason: n for n, reason in enumerate(_WORDS)}  # where each comes in _WORDS


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def figures(verdict: dict[str, Any]) -> str:
    """What one node's verdict says in figures, e.g. `need H100, have A100-40GB`."""
    reason = verdict["reason"]
    asked, used, cap = verdict.get("asked"), verdict.get("used"), verdict.get("capacity")
    detail = verdict.get("detail", "")
    if reason in ("gpu_model", "gpu_count", "target"):
        have = "" if cap is None else f", have {_num(cap)}"
        return f"need {_num(asked)}{have}"
    if reason == "gpu_memory":
        return f"need {_num(asked)} GB per gpu, have {_num(cap)} GB"
    if reason == "selector":
        return f"need {asked}, have {cap or 'none'}"
    if reason in ("cpu_total", "memory_total", "disk"):
        return f"need {_num(asked)}, have {_num(cap)}"
    if reason == "offline" and used is not None and used >= 0:
        return f"{_num(used)} s"
    if reason in ("gpus_busy", "cpus_busy", "memory_busy", "slots"):
        need = f", need {_num(asked)}" if asked is not None else ""
        return f"{_num(used)}/{_num(cap)} in use{need}"
    if reason in ("reserved", "unhealthy", "plugin"):
        return str(detail)
    return ""


def alternative_line(alt: dict[str, Any], total: int) -> str:
    """`0/4 nodes fit: 2 gpu model (need H100, have A100-40GB); 1 draining; 1 offline 45 s`"""
    if "quota" in alt:
        q = alt["quota"]
        return (
            f"quota: {q['scope']} {q['name']} holds {q['used']} of {q['limit']} gpus, "
            f"asks {q['asked']}"
        )
    first: dict[str, dict[str, Any]] = {}
    haves: dict[str, list[Any]] = {}
    for verdict in alt.get("nodes", ()):
        first.setdefault(verdict["reason"], verdict)
        have = haves.setdefault(verdict["reason"], [])
        if verdict.get("capacity") not in have:
            have.append(verdict.get("capacity"))
    for reason, have in haves.items():  # nodes that differ: `have H100-80GB or none`
        if len(have) > 1 and reason in ("gpu_model", "gpu_count", "selector"):
            shown = sorted(have, key=lambda h: (h in ("", "none", 0), str(h)))
            first[reason] = {**first[reason], "capacity": " or ".join(map(_num, shown))}
    parts = []
    counts = alt.get("counts", {})
    for reason in sorted(counts, key=lambda r: (-counts[r], _ORDER.get(r, 99))):
        words = f"{counts[reason]} {_WORDS.get(reason, reason)}"
        said = figures(first[reason]) if reason in first else ""
        if said and reason == "offline":
            words += f" {said}"
        elif said:
            words += f" ({said})"
        parts.append(words)
    fits = alt.get("fits", 0)
    return (
        f"{fits}/{total} nodes fit: " + "; ".join(parts) if parts else f"{fits}/{total} nodes fit"
    )


def one_line(record: dict[str, Any]) -> str:
    """The decision in one line: where it went, or why it waits."""
    outcome = record["outcome"]
    if outcome == "placed":
        chosen = record["chosen"]
        where = ", ".join(
            n["node"] + (f" gpu {','.join(map(str, n['gpus']))}" if n["gpus"] else "")
            for n in chosen["nodes"]
        )
        alt = f" (alternative {chosen['alternative'] + 1})" if chosen["alternative"] else ""
        return f"placed on {where}{alt}"
    if outcome == "preempting":
        victims = record.get("victims", [])
        names = ", ".join(f"{v['run']} ({v['tier']})" for v in victims)
        on = record["reserved"]
        return f"stopping {len(victims)} preemptible attempt(s) on {on} for it: {names}"
    alts = record.get("alternatives", [])
    total = record.get("nodes_total", 0)
    line = alternative_line(alts[0], total) if alts else "waiting"
    if len(alts) > 1:
        line += f" (and {len(alts) - 1} more alternative(s), none fits)"
    if record.get("reserved"):
        line += f"; holds {record['reserved']} for it"
    return line


def lines(record: dict[str, Any]) -> list[str]:
    """`orbit explain`: the decision whole."""
    out = [
        f"run {record['run']}  attempt {record['attempt']}",
        f"  {record['outcome']}: {one_line(record)}",
        f"  tier {record['tier']}, position {record['position']} in its pass, "
        f"waited {_num(record['waited_s'])} s",
    ]
    total = record.get("nodes_total", 0)
    for n, alt in enumerate(record.get("alternatives", [])):
        out.append(f"  alternative {n + 1}: {alt.get('ask', '')}")
        out.append(f"    {alternative_line(alt, total)}")
        for verdict in alt.get("nodes", ()):
            said = figures(verdict)
            word = _WORDS.get(verdict["reason"], verdict["reason"])
            out.append(f"      {verdict['node']}: {word}" + (f" ({said})" if said else ""))
    chosen = record.get("chosen")
    if chosen:
        out.append(f"  alternative {chosen['alternative'] + 1}: {chosen['ask']}")
        out.append(f"    fits; {chosen['considered']} node(s) looked at before choosing")
    for victim in record.get("victims", ()):
        out.append(
            f"  preempting {victim['run']} ({victim['tier']}, {victim['gpus']} gpu) "
            f"on {victim['node']}"
        )
    if record["outcome"] == "waiting":
        eta = record.get("estimated_start")
        if eta:
            from datetime import UTC, datetime

            when = datetime.fromtimestamp(eta, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            out.append(f"  may start by {when} (the max_runtime of what holds its nodes)")
        else:
            out.append("  no estimated start: what holds its nodes has no max_runtime")
    out.append(f"  snapshot {record['snapshot']}, scheduler config {record['config']}")
    return out


def as_of(record: dict[str, Any], age_s: float) -> dict[str, Any]:
    """The decision as it stands `age_s` after its pass, for a run that still waits on it:
    its wait that much longer, and each offline node silent that much longer (a pass keeps a
    decision again only when it changes, so these figures would otherwise stay as first
    written)."""
    if age_s <= 0:
        return record
    aged = dict(record)
    aged["waited_s"] = round(float(record.get("waited_s", 0.0)) + age_s, 1)
    aged["alternatives"] = [_aged(alt, age_s) for alt in record.get("alternatives", ())]
    return aged


def _aged(alt: dict[str, Any], age_s: float) -> dict[str, Any]:
    nodes = []
    for verdict in alt.get("nodes", ()):
        used = verdict.get("used")
        if verdict.get("reason") == "offline" and isinstance(used, int | float) and used >= 0:
            verdict = {**verdict, "used": round(used + age_s, 1)}
        nodes.append(verdict)
    return {**alt, "nodes": nodes}

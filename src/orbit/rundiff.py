"""`orbit diff`: what differs between two runs, as flat facts compared key by key. Pure."""

from __future__ import annotations

import re
from typing import Any

from orbit.evidence import Evidence
from orbit.models import Record

SECRET_KEY = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH)", re.IGNORECASE)
MASK = "***"


class Difference(Record):
    key: str
    a: str | None
    b: str | None


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(f"{prefix}.{key}", value[key], out)
    elif value not in (None, {}, [], ()):
        out[prefix] = str(value)


def facts(ev: Evidence) -> dict[str, str]:
    """Everything `diff` compares, as `section.key -> value`. Env values whose names look
    secret are never shown, only whether they differ."""
    out: dict[str, str] = {}
    run, attempt = ev.run, ev.attempt
    job = ev.json("job.json") or {}
    out["bundle.digest"] = run.bundle_digest
    out["task.type"] = run.task_type
    _flatten("task.request", job.get("task_request", {}), out)
    _flatten("task.entrypoint", " ".join(job.get("entrypoint", [])), out)
    out["template.id"] = run.template_id
    _flatten(
        "overrides",
        {k: v for k, v in run.submission.get("overrides", {}).items() if v is not None},
        out,
    )
    _flatten("resources", run.request.get("resources", {}), out)
    out["target"] = attempt.target or "-"
    for key, value in sorted(job.get("env", {}).items()):
        out[f"env.{key}"] = MASK if SECRET_KEY.search(key) else str(value)
    precheck = ev.json("runtime/precheck.json") or {}
    python = precheck.get("python", {})
    _flatten(
        "python", {"version": python.get("version"), "executable": python.get("executable")}, out
    )
    for item in precheck.get("critical_imports", []):
        where = (
            f"{item.get('version') or '?'} @ {item.get('path')}" if item.get("ok") else "MISSING"
        )
        out[f"deps.{item.get('name')}"] = where
    for line in precheck.get("distributions", {}).get("lines", []):
        name, sep, version = line.partition("==")
        if sep:
            out[f"packages.{name.lower()}"] = version
    gpus = precheck.get("gpus", {})
    devices = gpus.get("devices", []) if gpus.get("present") else []
    out["gpu.count"] = str(len(devices))
    if devices:
        out["gpu.model"] = ", ".join(sorted({str(d.get("name")) for d in devices}))
        _flatten(
            "gpu",
            {"driver": gpus.get("driver_version"), "cuda": gpus.get("cuda_driver_version")},
            out,
        )
    host = precheck.get("host", {})
    _flatten("host", {"hostname": host.get("hostname"), "kernel": host.get("kernel")}, out)
    provenance = ev.json("inputs/.orbit/provenance.json") or {}
    for index, source in enumerate(provenance.get("sources", [])):
        label = source.get("path", index)
        out[f"git.sources.{label}.commit"] = str(source.get("commit"))
        out[f"git.sources.{label}.dirty"] = str(bool(source.get("dirty")))
    workdir = provenance.get("workdir")
    if workdir:
        out["git.workdir.commit"] = str(workdir.get("commit"))
        out["git.workdir.dirty"] = str(bool(workdir.get("dirty")))
    return out


def diff_runs(a: Evidence, b: Evidence) -> list[Difference]:
    """Every fact that differs. A secret-looking env value is compared but never shown."""
    fa, fb = facts(a), facts(b)
    env_a = (a.json("job.json") or {}).get("env", {})
    env_b = (b.json("job.json") or {}).get("env", {})
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va == MASK and vb == MASK and env_a.get(key[4:]) != env_b.get(key[4:]):
            va, vb = f"{MASK} (differs)", f"{MASK} (differs)"
        if va != vb:
            out.append(Difference(key=key, a=va, b=vb))
    return out

"""`orbit diff`: what differs between two runs, as flat facts compared key by key. Pure."""

from __future__ import annotations

from typing import Any

from orbit.forensics.evidence import Evidence
from orbit.model.models import Record
from orbit.model.secret_names import looks_secret

MASK = "***"


class Difference(Record):
    key: str
    a: str | None
    b: str | None


def _flatten(
    prefix: str, value: Any, out: dict[str, str], secrets: dict[str, str] | None = None
) -> None:
    """With `secrets`, a value under a secret-looking key is masked in `out` and kept
    (for comparing only) in `secrets`."""
    if isinstance(value, dict) and value:
        for key in sorted(value):
            path = f"{prefix}.{key}"
            if secrets is not None and looks_secret(str(key)) and not isinstance(value[key], dict):
                out[path], secrets[path] = MASK, str(value[key])
            else:
                _flatten(path, value[key], out, secrets)
    elif value not in (None, {}, [], ()):
        out[prefix] = str(value)


def facts(ev: Evidence) -> dict[str, str]:
    """Everything `diff` compares, as `section.key -> value`. Values whose names look
    secret are never shown, only whether they differ."""
    return _facts(ev)[0]


def _facts(ev: Evidence) -> tuple[dict[str, str], dict[str, str]]:
    """The facts, and the real values behind the masked ones (never to be shown)."""
    out: dict[str, str] = {}
    secrets: dict[str, str] = {}
    run, attempt = ev.run, ev.attempt
    job = ev.json("job.json") or {}
    out["bundle.digest"] = run.bundle_digest
    out["task.type"] = run.task_type
    _flatten("task.request", job.get("task_request", {}), out, secrets)
    _flatten("task.entrypoint", " ".join(job.get("entrypoint", [])), out)
    out["template.id"] = run.template_id
    _flatten(
        "overrides",
        {
            k: v
            for k, v in run.submission.overrides.model_dump(mode="json").items()
            if v is not None
        },
        out,
        secrets,
    )
    _flatten("resources", run.request.resources.model_dump(mode="json"), out)
    out["target"] = attempt.target or "-"
    _flatten("env", job.get("env", {}), out, secrets)
    _flatten("launch_mode", job.get("launch_mode", {}), out)
    image = ev.json("runtime/image.json") or {}  # what a docker run actually ran
    _flatten(
        "image",
        {"id": image.get("id"), "digests": ", ".join(image.get("repo_digests") or []) or None},
        out,
    )
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
    return out, secrets


def diff_runs(a: Evidence, b: Evidence) -> list[Difference]:
    """Every fact that differs. A secret-looking value is compared but never shown."""
    (fa, secrets_a), (fb, secrets_b) = _facts(a), _facts(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va == MASK and vb == MASK and secrets_a.get(key) != secrets_b.get(key):
            # both sides read the same, so compare the hidden values, not what is shown
            out.append(Difference(key=key, a=f"{MASK} (differs)", b=f"{MASK} (differs)"))
        elif va != vb:
            out.append(Difference(key=key, a=va, b=vb))
    return out

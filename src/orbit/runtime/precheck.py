#!/usr/bin/env python3
"""ORBIT precheck: record what the task's own interpreter loads, and gate the task on it.

Travels inside the bundle as scripts/orbit_precheck.py and runs with the task's interpreter,
environment and working directory, so what it sees is what the task will see. Standard
library only (it reads NVML through the vendored pynvml next to it when there is one).

Writes runtime/precheck.json (for machines) and artifacts/runtime-precheck.log (for people):
python version and path, each critical import's version and resolved file, the interpreter's
installed distributions (as `pip freeze` lists them), GPUs with driver and CUDA versions,
hostname, kernel, and every staged fork (inputs/**/FORK_MANIFEST.json) with the proof that
its package is loaded from the staged copy.

The wrapper runs it before the task when it has something to gate (critical imports, a
staged fork); without either it only records, and runs beside the task as the task starts.

Exit status: 0 all good; 10 a declared dependency is missing; 11 a dependency or staged fork
is not the one loaded.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

TYPE_CHECKING = False  # typing costs ~5 ms of a start this script makes on every run
if TYPE_CHECKING:  # as mypy reads them
    import importlib.metadata
    from collections.abc import Iterable
    from typing import Any

    from orbit.runtime import dist_cache
else:
    try:  # in a bundle: beside this file in scripts/
        import orbit_dist_cache as dist_cache
    except ImportError:
        try:  # as part of the orbit package
            from orbit.runtime import dist_cache
        except ImportError:  # PYTHONSAFEPATH=1 keeps scripts/ off sys.path: no cache then
            dist_cache = None

EXIT_MISSING = 10
EXIT_MISMATCH = 11
IMPORT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def module_version(name: str, module: Any) -> str | None:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    import importlib.metadata

    top = name.split(".")[0]
    mapping = getattr(importlib.metadata, "packages_distributions", None)  # Python >= 3.10
    for dist in mapping().get(top, []) if mapping else [top]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_import(name: str) -> dict[str, Any]:
    import importlib

    try:
        module = importlib.import_module(name)
    except Exception as exc:  # ImportError, or the package's own failure at import
        return {"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    path = getattr(module, "__file__", None)
    return {
        "name": name,
        "ok": True,
        "version": module_version(name, module),
        "path": os.path.realpath(path) if path else None,
    }


def name_version(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None]:
    """The Name and Version headers of `dist`'s metadata, read off the top of the file:
    a tenth of the cost of `dist.metadata`'s full email parse, which is the fallback."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    found: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key in ("Name", "Version") and key not in found:
            found[key] = value.strip()
    if "Name" in found and "Version" in found:
        return found["Name"], found["Version"]
    return dist.metadata["Name"], dist.version


def freeze_line(dist: importlib.metadata.Distribution, name: str, version: str | None) -> str:
    """The line `pip freeze` writes for `dist`: name==version, or where it came from for a
    direct-URL install (PEP 610's direct_url.json): a VCS commit, an archive, an editable
    checkout."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if not isinstance(direct, dict) or not isinstance(direct.get("url"), str):
        return f"{name}=={version}"
    url, vcs = direct["url"], direct.get("vcs_info")
    if isinstance(vcs, dict):
        url = f"{vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}"
    if (direct.get("dir_info") or {}).get("editable"):
        path = url[len("file://") :] if url.startswith("file://") else url  # (3.8: no removeprefix)
        return f"-e {path}  # {name}=={version}"
    return f"{name} @ {url}"


def describe(dists: Iterable[importlib.metadata.Distribution]) -> dist_cache.Items:
    """Each distribution as the listing needs it, in the order found: ["dist", key, the line
    pip freeze writes], or ["badline", key, why] where that line cannot be made (said only for
    the first of its name), or ["unreadable", why] where its name cannot be read (always said).
    Never fatal: a broken or oddly encoded METADATA is a line of the record."""
    items: dist_cache.Items = []
    for dist in dists:
        where = getattr(dist, "_path", "?")
        try:
            name, version = name_version(dist)
            key = re.sub(r"[-_.]+", "-", name or "").lower()
        except Exception as exc:
            items.append(["unreadable", f"# unreadable: {where}: {type(exc).__name__}: {exc}"])
            continue
        if not name:
            continue
        try:
            items.append(["dist", key, freeze_line(dist, name, version)])
        except Exception as exc:
            items.append(["badline", key, f"# unreadable: {where}: {type(exc).__name__}: {exc}"])
    return items


def read_folder(folder: str) -> dist_cache.Items:
    """describe() of one folder of sys.path (see scripts/orbit_dist_cache.py)."""
    import importlib.metadata

    return describe(importlib.metadata.distributions(path=[folder]))


def installed_distributions() -> tuple[dict[str, Any], str]:
    """What `pip freeze --all` would list for this interpreter, read from its metadata in
    this process (a `pip` child costs 0.15 to 0.7 s of CPU a run): the first distribution of
    each name on sys.path, as the import system finds it, in pip's sorted order. Each folder's
    part is read afresh or, unchanged since, from the cache (scripts/orbit_dist_cache.py); and
    how many came from there ("off": no cache, the whole path read in one go)."""
    found = dist_cache.listing(read_folder, __file__) if dist_cache is not None else None
    if found is None:
        import importlib.metadata

        found = describe(importlib.metadata.distributions()), "off"
    items, cached = found
    seen: dict[str, str] = {}
    unreadable: list[str] = []
    for item in items:
        if item[0] == "unreadable":
            unreadable.append(item[1])
        elif item[1] not in seen:  # the first of each name: its line, or why there is none
            if item[0] == "dist":
                seen[item[1]] = item[2]
            else:
                unreadable.append(item[2])
    lines = [seen[k] for k in sorted(seen)] + unreadable
    return {"source": "importlib.metadata", "lines": lines}, cached


# Where a host with NVIDIA's driver shows it (as scripts/orbit_sidecars.py): NVML needs one
NVIDIA_DRIVER = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def gpus() -> dict[str, Any]:
    if not any(os.path.exists(p) for p in NVIDIA_DRIVER):  # no pynvml import (~20-40 ms)
        return {
            "present": False,
            "reason": "NVML unavailable: no NVIDIA driver on this host (none of "
            + ", ".join(NVIDIA_DRIVER)
            + ")",
        }
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

        pynvml.nvmlInit()
    except Exception as exc:
        return {"present": False, "reason": f"NVML unavailable: {exc}"}
    try:

        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                {
                    "index": index,
                    "name": text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": text(pynvml.nvmlDeviceGetUUID(handle)),
                    "memory_total_mib": memory.total // (1 << 20),
                }
            )
        return {
            "present": bool(devices),
            "driver_version": text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "devices": devices,
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    except Exception as exc:
        return {"present": False, "reason": f"NVML error: {exc}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def find_fork_manifests(inputs: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(inputs):
        dirs[:] = sorted(d for d in dirs if d not in {".git", "__pycache__", ".orbit"})
        if "FORK_MANIFEST.json" in files:
            found.append(os.path.join(root, "FORK_MANIFEST.json"))
    return found


def check_fork(path: str, inputs: str) -> dict[str, Any]:
    rel = os.path.relpath(path, os.path.dirname(inputs))
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        package, commit = manifest["package"], manifest["upstream_commit"]
        patch = manifest.get("patch_digest")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {
            "manifest": rel,
            "ok": False,
            "error": f"{rel} does not parse: {type(exc).__name__}: {exc}",
        }
    if not isinstance(commit, str) or not COMMIT.match(commit):
        return {
            "manifest": rel,
            "ok": False,
            "error": f"{rel}: upstream_commit {commit!r} is not a 40-character hex commit",
        }
    fork_dir = os.path.realpath(os.path.dirname(path))
    found = check_import(package)
    result = {
        "manifest": rel,
        "package": package,
        "upstream_commit": commit,
        "patch_digest": patch,
        "fork_dir": fork_dir,
        "loaded": found,
    }
    loaded = found.get("path") or ""
    result["ok"] = bool(found["ok"]) and loaded.startswith(fork_dir + os.sep)
    if not found["ok"]:
        result["error"] = f"{rel}: package '{package}' does not import: {found['error']}"
    elif not result["ok"]:
        result["error"] = (
            f"{rel}: package '{package}' is loaded from {loaded}, "
            f"not from the staged fork in {fork_dir}"
        )
    return result


def utc_now() -> str:
    """As datetime.now(timezone.utc).isoformat() writes it, without importing datetime."""
    now = time.time()
    micro = int(now % 1 * 1_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    return stamp + (f".{micro:06d}" if micro else "") + "+00:00"


def python_version() -> str:
    """As platform.python_version() writes it (3.11.2, 3.13.0rc1), without importing platform."""
    version = sys.version.split()[0]
    return version + ".0" if version.count(".") == 1 else version


def run(job: dict[str, Any], inputs: str) -> tuple[dict[str, Any], int]:
    spec = job.get("precheck", {})
    imports = [check_import(n) for n in spec.get("critical_imports", [])]
    optional = [check_import(n) for n in spec.get("optional_imports", [])]
    forks = [check_fork(p, inputs) for p in find_fork_manifests(inputs)]
    uname = os.uname()  # platform.uname() and socket.gethostname() read the same
    distributions, cached = installed_distributions()
    report = {
        "schema_version": 1,
        "at": utc_now(),
        "host": {
            "hostname": uname.nodename,
            "kernel": uname.release,
            "os": f"{uname.sysname} {uname.version}",
            "machine": uname.machine,
        },
        "python": {
            "version": python_version(),
            "executable": sys.executable,
            "prefix": sys.prefix,
        },
        "critical_imports": imports,
        "optional_imports": optional,
        "forks": forks,
        "gpus": gpus(),
        "distributions": distributions,
        "distributions_cache": cached,
    }
    code = 0
    if any(not i["ok"] for i in imports):
        code = EXIT_MISSING
    if any(not f["ok"] for f in forks):
        code = EXIT_MISMATCH
    report["ok"] = code == 0
    return report, code


def human(report: dict[str, Any]) -> str:
    lines = [
        f"precheck at {report['at']} on {report['host']['hostname']} "
        f"(kernel {report['host']['kernel']})",
        f"python {report['python']['version']} at {report['python']['executable']}",
    ]
    for item in report["critical_imports"]:
        if item["ok"]:
            lines.append(f"ok       {item['name']} {item['version'] or '?'} from {item['path']}")
        else:
            lines.append(f"MISSING  {item['name']}: {item['error']}")
    absent = []
    for item in report.get("optional_imports", []):
        if item["ok"]:
            lines.append(f"ok       {item['name']} {item['version'] or '?'} from {item['path']}")
        else:
            absent.append(item["name"])
    if absent:  # said once, not per import: an optional one is not a failure
        lines.append(f"absent   {', '.join(absent)} (optional: not importable here)")
    for fork in report["forks"]:
        state = "ok      " if fork["ok"] else "MISMATCH"
        detail = fork.get("error") or (
            f"{fork['manifest']}: {fork['package']} loaded from {fork['loaded']['path']}"
        )
        lines.append(f"{state} fork {detail}")
    g = report["gpus"]
    if g.get("present"):
        lines.append(f"gpus     driver {g['driver_version']}, CUDA {g['cuda_driver_version']}")
        lines += [
            f"  gpu {d['index']}: {d['name']} {d['memory_total_mib']} MiB {d['uuid']}"
            for d in g["devices"]
        ]
    else:
        lines.append(f"gpus     none ({g.get('reason', 'no devices')})")
    dists = report["distributions"]
    lines.append(f"packages ({dists['source']}):")
    lines += [f"  {line}" for line in dists["lines"]]
    lines.append("precheck passed" if report["ok"] else "precheck FAILED")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--bundle":  # as the wrapper calls it: no argparse (~9 ms)
        bundle = os.path.abspath(argv[1])
    else:
        import argparse

        parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
        parser.add_argument("--bundle", required=True)
        bundle = os.path.abspath(parser.parse_args(argv).bundle)
    with open(os.path.join(bundle, "job.json"), encoding="utf-8") as f:
        job = json.load(f)
    report, code = run(job, os.path.join(bundle, "inputs"))
    tmp = os.path.join(bundle, "runtime", f"precheck.json.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(bundle, "runtime", "precheck.json"))
    with open(
        os.path.join(bundle, "artifacts", "runtime-precheck.log"), "w", encoding="utf-8"
    ) as f:
        f.write(human(report))
    return code


if __name__ == "__main__":
    sys.exit(main())

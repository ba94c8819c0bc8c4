"""Writes the argument names of the installed ms-swift, per `swift MODE`, to
src/orbit/core/tasks/swift_args/VERSION.json: the list the `swift` task type checks a
request's args against before freezing (ms-swift exits on any unknown flag).

Run it with the python that has ms-swift, e.g. after tools/swift-venv.sh:
    .venv-swift/bin/python tools/swift_args.py
The names are read from ms-swift's own argument dataclasses (and what they inherit from
transformers' TrainingArguments), so the list is exactly what that version parses.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from importlib.metadata import version
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src" / "orbit" / "core" / "tasks" / "swift_args"
# defaults the shape checks and the launcher need, per mode: GRPO's generation batch, and the
# port `swift rollout` serves on (the node's --service URL names it)
DEFAULTS = {
    "rlhf": (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "num_generations",
    ),
    "rollout": ("port",),
}


def argument_classes() -> dict[str, type]:
    """Each mode's dataclass: in swift.arguments (4.x), or in swift.llm (3.x)."""
    try:
        import swift.arguments as found

        sft = found.SftArguments
    except ImportError:
        import swift.llm as found  # type: ignore[no-redef]

        sft = found.TrainArguments
    classes = {
        "sft": sft,
        "pt": getattr(found, "PretrainArguments", sft),
        "rlhf": found.RLHFArguments,
        "infer": found.InferArguments,
        "eval": found.EvalArguments,
        "rollout": getattr(found, "RolloutArguments", None),  # GRPO's vLLM server, 3.5 on
    }
    return {mode: cls for mode, cls in classes.items() if cls is not None}


def rlhf_types(cls: type) -> list[str]:
    hint = typing.get_type_hints(cls).get("rlhf_type")
    return sorted(str(a) for a in typing.get_args(hint)) if hint is not None else []


def main() -> int:
    swift_version = version("ms-swift")
    classes = argument_classes()
    modes = {mode: sorted(f.name for f in dataclasses.fields(cls)) for mode, cls in classes.items()}
    defaults: dict[str, dict[str, Any]] = {}
    for mode, names in DEFAULTS.items():
        for field in dataclasses.fields(classes[mode]) if mode in classes else ():
            if field.name in names and field.default is not dataclasses.MISSING:
                defaults.setdefault(mode, {})[field.name] = field.default
    data = {
        "version": swift_version,
        "made_by": "tools/swift_args.py",
        "rlhf_types": rlhf_types(classes["rlhf"]),
        "defaults": defaults,
        "modes": modes,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{swift_version}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    counts = ", ".join(f"{mode} {len(names)}" for mode, names in modes.items())
    print(f"{path}: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

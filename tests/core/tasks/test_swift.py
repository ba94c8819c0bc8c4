"""The `swift` task type's shaping and refusals, before anything is frozen (no ms-swift
needed: the argument names come from the list shipped for the declared version), and its
launcher's choices on the node (GPUs, ports, resume) with a stand-in `swift` that prints
what it was given."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.core.tasks import TaskRegistry
from orbit.core.tasks.swift import LAUNCHER
from orbit.model.errors import InvalidInput
from orbit.model.models import FailureReason, RunState
from orbit.model.nodes import SERVICE_LABEL
from orbit.runtime.checkpoint_finder import newest_checkpoint
from tests.runtime.test_precheck import (
    attempt_dir,
    make_venv,
    precheck_log,
    precheck_report,
    submit,
    wait_all,
)

GRPO: dict[str, Any] = {
    "mode": "rlhf",
    "rlhf_type": "grpo",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "dataset": ["AI-MO/NuminaMath-TIR#100"],
    "tuner_type": "lora",
    "args": {"reward_funcs": ["accuracy"], "num_generations": 4},
}


def shape(request: dict[str, Any], base_dir: Path = Path(".")) -> Any:
    return TaskRegistry().shape("swift", request, base_dir, "spec.yaml")


def settings(request: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(shape(request).env["ORBIT_SWIFT"])
    return data


def refusal(request: dict[str, Any]) -> str:
    with pytest.raises(InvalidInput) as exc:
        shape(request)
    line = str(exc.value)
    assert "\n" not in line
    return line


def test_sft_becomes_swift_sft_with_the_tuner_type_of_4x() -> None:
    found = settings(
        {
            "mode": "sft",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "dataset": ["a.jsonl", "b#500"],
            "tuner_type": "lora",
            "args": {
                "lora_rank": 8,
                "target_modules": ["all-linear"],
                "gradient_checkpointing": True,
            },
        }
    )
    assert found["subcommand"] == "sft"
    assert found["argv"] == [
        "--model", "Qwen/Qwen2.5-7B-Instruct", "--dataset", "a.jsonl", "b#500",
        "--tuner_type", "lora", "--lora_rank", "8", "--target_modules", "all-linear",
        "--gradient_checkpointing", "true",
    ]  # fmt: skip


def test_3x_name_train_type_is_mapped_by_the_declared_version() -> None:
    request = {"mode": "sft", "model": "m", "dataset": ["d"], "train_type": "full"}
    assert "--tuner_type" in settings(request)["argv"]  # 4.x: renamed
    assert settings(request)["argv"][-2:] == ["--tuner_type", "full"]
    assert "both" in refusal({**request, "tuner_type": "lora"})


def test_grpo_becomes_swift_rlhf_with_its_type_and_vllm() -> None:
    request = {**GRPO, "vllm": {"mode": "colocate"}}
    shaped = shape(request)
    argv = json.loads(shaped.env["ORBIT_SWIFT"])["argv"]
    assert argv[:2] == ["--rlhf_type", "grpo"]
    assert argv[-4:] == ["--use_vllm", "true", "--vllm_mode", "colocate"]
    # what ms-swift needs for GRPO and does not declare, and vllm as it is used: critical
    assert {"msgspec", "math_verify", "vllm"} <= set(shaped.critical_imports)
    assert "vllm" not in shaped.optional_imports
    assert shaped.optional_imports == ("deepspeed", "flash_attn")


@pytest.mark.parametrize(
    ("request_", "names"),
    [
        ({"mode": "sft", "model": "m", "dataset": ["d"], "args": {"lora_rnak": 8}}, "lora_rnak"),
        ({"mode": "sft", "model": "m", "dataset": ["d"], "args": {"model": "x"}}, "args.model"),
        ({"mode": "sft", "model": "m", "dataset": ["d"], "version": "2.0.0"}, "task.version"),
        ({"mode": "train", "model": "m", "dataset": ["d"]}, "task.mode"),
        ({"mode": "rlhf", "model": "m", "dataset": ["d"]}, "rlhf_type"),
        ({"mode": "rlhf", "rlhf_type": "grpx", "model": "m", "dataset": ["d"]}, "rlhf_type"),
        ({"mode": "sft", "model": "m"}, "dataset"),
        ({**GRPO, "args": {"num_generations": 4}}, "task.args.reward_funcs"),
        ({**GRPO, "vllm": {"mode": "server"}}, "task.vllm"),
        ({**GRPO, "vllm": {"mode": "server", "service": "r", "endpoint_env": "U"}}, "task.vllm"),
        ({"mode": "rollout", "model": "m", "output_dir": "o"}, "output_dir"),
        ({"mode": "rollout", "model": "m", "vllm": {"mode": "colocate"}}, "task.vllm"),
        ({"mode": "rollout", "model": "m", "args": {"num_generations": 4}}, "`swift rollout`"),
        ({"mode": "rollout", "model": "m", "args": {"port": "8000"}}, "task.args.port"),
    ],
)
def test_bad_requests_are_refused_in_one_line_naming_the_field(
    request_: dict[str, Any], names: str
) -> None:
    assert names in refusal(request_)


ROLLOUT: dict[str, Any] = {
    "mode": "rollout",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "args": {"vllm_tensor_parallel_size": 1, "vllm_enable_lora": True},
}


def test_rollout_becomes_swift_rollout_on_ms_swifts_port_with_vllm_critical() -> None:
    shaped = shape(ROLLOUT)
    found = json.loads(shaped.env["ORBIT_SWIFT"])
    assert (found["subcommand"], found["port"]) == ("rollout", 8000)  # ms-swift's default
    assert found["argv"] == [
        "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--vllm_tensor_parallel_size", "1",
        "--vllm_enable_lora", "true",
    ]  # fmt: skip
    assert "vllm" in shaped.critical_imports and "vllm" not in shaped.optional_imports
    assert settings({**ROLLOUT, "args": {"port": 8011}})["port"] == 8011


def test_grpo_asks_for_a_node_advertising_its_rollout_service() -> None:
    def selector(vllm: dict[str, Any]) -> dict[str, str]:
        return TaskRegistry().selector("swift", {**GRPO, "vllm": vllm}, "spec.yaml")

    assert selector({"mode": "server", "service": "rollout"}) == {f"{SERVICE_LABEL}rollout": "yes"}
    assert selector({"mode": "server", "endpoint_env": "ROLLOUT_URL"}) == {}
    assert selector({"mode": "colocate"}) == {}
    # the service is the rollout endpoint: server mode takes it as one
    assert settings({**GRPO, "vllm": {"mode": "server", "service": "rollout"}})["vllm"] == {
        "mode": "server",
        "service": "rollout",
    }


def test_an_unknown_argument_is_refused_with_the_nearest_known_names() -> None:
    line = refusal({"mode": "sft", "model": "m", "dataset": ["d"], "args": {"lora_rnak": 8}})
    assert line == (
        "task.args.lora_rnak: ms-swift 4.6.0 `swift sft` has no argument 'lora_rnak' "
        "(did you mean lora_rank, local_rank, galore_rank?)"
    )


def test_a_grpo_batch_ms_swift_would_reject_is_refused_by_its_processes() -> None:
    from orbit.model.models import ExecutionRequest, LaunchMode, Placement, Resources

    def check(args: dict[str, Any], gpus: int, nodes: int = 1) -> None:
        execution = ExecutionRequest(
            template_id="t",
            placement=Placement(kind="agent_pool"),
            launch_mode=LaunchMode(kind="host_process"),
            target=None,
            detach=True,
            resources=Resources(gpu_count=gpus),
            runtime_env={},
            stop_grace_s=10,
            num_nodes=nodes,
        )
        TaskRegistry().check_resources("swift", {**GRPO, "args": args}, "spec.yaml", execution)

    base = {"reward_funcs": ["accuracy"], "per_device_train_batch_size": 2}
    check({**base, "num_generations": 4, "steps_per_generation": 2}, gpus=1)
    check({**base, "num_generations": 6, "steps_per_generation": 1}, gpus=3)  # 2 x 1 x 3
    check({**base, "num_generations": 8, "steps_per_generation": 1}, gpus=2, nodes=2)
    with pytest.raises(InvalidInput) as exc:
        check({**base, "num_generations": 6, "steps_per_generation": 1}, gpus=2)
    assert str(exc.value) == (
        "task.args.num_generations: per_device_train_batch_size 2 x 2 processes x "
        "steps_per_generation 1 = 4 is not divisible by num_generations 6 (each prompt's "
        "completions must fall in one batch)"
    )
    with pytest.raises(InvalidInput, match="generation_batch_size 10"):
        check({**base, "num_generations": 4, "generation_batch_size": 10}, gpus=1)
    # steps per generation default to the accumulation steps, as ms-swift's do
    check({**base, "num_generations": 4, "gradient_accumulation_steps": 2}, gpus=1)
    with pytest.raises(InvalidInput, match="steps_per_generation 3 = 6"):
        check({**base, "num_generations": 4, "gradient_accumulation_steps": 3}, gpus=1)


# --- the launcher on the node: a stand-in `swift` beside the python prints its argv and env ----

STANDIN = """#!/bin/sh
echo "argv $*"
echo "env CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} NPROC_PER_NODE=${NPROC_PER_NODE-unset}\
 NNODES=${NNODES-unset} NODE_RANK=${NODE_RANK-unset} MASTER_ADDR=${MASTER_ADDR-unset}\
 MASTER_PORT=${MASTER_PORT-unset}"
"""


def run_launcher(
    tmp_path: Path, request: dict[str, Any], **env: str
) -> subprocess.CompletedProcess[str]:
    """Run the launcher as the wrapper would, with a fake `swift` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "swift").write_text(STANDIN)
    (bin_dir / "swift").chmod(0o755)
    shaped = shape(request)
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CUDA_"))},
        **shaped.env,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ORBIT_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        **env,
    }
    return subprocess.run([sys.executable, str(LAUNCHER)], env=full, capture_output=True, text=True)


def launch(tmp_path: Path, request: dict[str, Any], **env: str) -> tuple[list[str], dict[str, str]]:
    done = run_launcher(tmp_path, request, **env)
    assert done.returncode == 0, done.stderr
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines()}
    pairs = dict(item.split("=", 1) for item in lines["env"].split(" "))
    return lines["argv"].split(" "), pairs


SFT = {"mode": "sft", "model": "m", "dataset": ["d"], "tuner_type": "lora"}


def test_the_launcher_gives_swift_exactly_the_attempts_gpus_and_a_free_master_port(
    tmp_path: Path,
) -> None:
    argv, env = launch(tmp_path, SFT, ORBIT_GPUS="2,5")
    assert (env["CUDA_VISIBLE_DEVICES"], env["NPROC_PER_NODE"]) == ("2,5", "2")
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert argv[argv.index("--output_dir") + 1] == str(tmp_path / "artifacts" / "checkpoints")
    # no GPUs: none visible, and no torchrun
    _, cpu = launch(tmp_path, SFT, CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert (cpu["CUDA_VISIBLE_DEVICES"], cpu["NPROC_PER_NODE"]) == ("", "unset")


def test_the_launcher_takes_a_gangs_nodes_from_orbits_contract(tmp_path: Path) -> None:
    _, env = launch(
        tmp_path,
        SFT,
        ORBIT_GPUS="0,1,2,3",
        ORBIT_NUM_NODES="2",
        ORBIT_NODE_RANK="1",
        ORBIT_MASTER_ADDR="10.0.0.7",
        ORBIT_MASTER_PORT="29611",
    )
    assert env == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "NPROC_PER_NODE": "4",
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29611",
    }


def test_server_mode_finds_the_rollout_server_in_an_env_var_and_a_free_group_port(
    tmp_path: Path,
) -> None:
    request = {**GRPO, "vllm": {"mode": "server", "endpoint_env": "ROLLOUT_URL"}}
    argv, _ = launch(tmp_path, request, ROLLOUT_URL="http://127.0.0.1:8011")
    given = dict(itertools.pairwise(argv))
    assert (given["--vllm_server_host"], given["--vllm_server_port"]) == ("127.0.0.1", "8011")
    first = int(given["--vllm_server_group_port"])
    again, _ = launch(tmp_path, request, ROLLOUT_URL="http://127.0.0.1:8011")
    assert first > 0 and again[again.index("--vllm_server_group_port") + 1].isdigit()


def test_server_mode_finds_the_rollout_server_among_the_nodes_services(tmp_path: Path) -> None:
    request = {**GRPO, "vllm": {"mode": "server", "service": "rollout"}}
    services = {"rollout": "http://127.0.0.1:8011", "sdxl": "http://127.0.0.1:7860"}
    argv, _ = launch(tmp_path, request, ORBIT_SERVICES=json.dumps(services))
    given = dict(itertools.pairwise(argv))
    assert (given["--vllm_server_host"], given["--vllm_server_port"]) == ("127.0.0.1", "8011")
    assert given["--vllm_server_group_port"].isdigit()
    # not advertised here: one line naming the field, exit 2, before swift starts
    for advertised, has in (({"sdxl": services["sdxl"]}, "sdxl"), (None, "none")):
        extra = {"ORBIT_SERVICES": json.dumps(advertised)} if advertised else {}
        done = run_launcher(tmp_path, request, **extra)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (
            f"orbit: task.vllm.service: rollout is not advertised on this node (it has: {has})\n"
        )


def test_the_launcher_serves_rollout_on_its_port_with_the_attempts_gpus(tmp_path: Path) -> None:
    port = free_port()
    argv, env = launch(tmp_path, {**ROLLOUT, "args": {"port": port}}, ORBIT_GPUS="3")
    assert argv[:2] == ["rollout", "--model"] and "--output_dir" not in argv
    assert argv.count("--port") == 1 and argv[argv.index("--port") + 1] == str(port)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    # ms-swift's default port not in args: the launcher gives it
    shaped = {**settings(ROLLOUT), "port": port}
    argv, _ = launch(tmp_path, ROLLOUT, ORBIT_SWIFT=json.dumps(shaped))
    assert argv[-2:] == ["--port", str(port)]
    # taken: ms-swift would serve on the next free port, not the one the node advertises
    with socket.socket() as taken:
        taken.bind(("", port))
        taken.listen()
        done = run_launcher(tmp_path, {**ROLLOUT, "args": {"port": port}})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"orbit: task.args.port: {port} is in use on this node (swift rollout would move off it)\n"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def swift_run(output_dir: Path, version: int, steps: list[int], link: int | None = None) -> Path:
    """An ms-swift run folder as it leaves one: vN-DATE-TIME/checkpoint-N and its link."""
    run = output_dir / f"v{version}-20250101-12000{version % 10}"
    for step in steps:
        (run / f"checkpoint-{step}").mkdir(parents=True)
    if link is not None:
        (run / "last-checkpoint").symlink_to(f"checkpoint-{link}")
    return run


def test_resume_goes_on_from_the_newest_checkpoint_of_the_newest_run_folder(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "artifacts" / "checkpoints"
    swift_run(checkpoints, 9, [5, 10])
    newest = swift_run(checkpoints, 10, [15, 20], link=20)  # v10 after v9, not by name
    swift_run(checkpoints, 11, [])  # a failed start leaves an empty one behind
    relpath = newest_checkpoint(str(tmp_path / "artifacts"))
    assert relpath == str((newest / "checkpoint-20").relative_to(tmp_path / "artifacts"))
    for resume in (checkpoints, newest, newest / "checkpoint-20"):
        argv, _ = launch(tmp_path, SFT, ORBIT_RESUME_FROM=str(resume))
        assert argv[argv.index("--resume_from_checkpoint") + 1] == str(newest / "checkpoint-20")
    argv, _ = launch(tmp_path, SFT)
    assert "--resume_from_checkpoint" not in argv


def test_a_checkpoint_whose_save_was_cut_short_is_passed_over(tmp_path: Path) -> None:
    """A stop during a save leaves checkpoint-N without trainer_state.json (HF Trainer's last
    file of a save): resume goes on from the last whole one, ORBIT's pick and swift's alike."""
    checkpoints = tmp_path / "artifacts" / "checkpoints"
    run = swift_run(checkpoints, 0, [4, 8, 12])
    for step in (4, 8):
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    relpath = newest_checkpoint(str(tmp_path / "artifacts"))
    assert relpath == str((run / "checkpoint-8").relative_to(tmp_path / "artifacts"))
    argv, _ = launch(tmp_path, SFT, ORBIT_RESUME_FROM=str(run))
    assert argv[argv.index("--resume_from_checkpoint") + 1] == str(run / "checkpoint-8")


# --- the precheck: ms-swift's stack recorded, what GRPO needs and does not declare gated -------


def test_the_precheck_records_swifts_stack_and_gates_grpo_on_what_swift_does_not_declare(
    service: CoreControlService, tmp_path: Path
) -> None:
    stack = {name: "1.0" for name in ("swift", "torch", "transformers", "peft", "trl")}
    python = make_venv(tmp_path / "venv", {**stack, "deepspeed": "0.17.0"})
    (python.parent / "swift").write_text("#!/bin/sh\necho swift ran\n")
    (python.parent / "swift").chmod(0o755)
    sft = submit(service, tmp_path, "swift", {**SFT, "interpreter": str(python)})
    grpo = submit(service, tmp_path, "swift", {**GRPO, "interpreter": str(python)})
    sft, grpo = wait_all(service, [sft, grpo])
    assert sft.state is RunState.SUCCEEDED, sft.current.message
    report = precheck_report(sft)
    assert [(i["name"], i["ok"]) for i in report["critical_imports"]] == [
        (name, True) for name in stack
    ]
    assert [(i["name"], i["ok"]) for i in report["optional_imports"]] == [
        ("deepspeed", True),
        ("vllm", False),
        ("flash_attn", False),
    ]
    log = precheck_log(sft)
    assert "ok       deepspeed 0.17.0 from " in log
    assert log.count("vllm") == 1  # said once, beside flash_attn
    assert "absent   vllm, flash_attn (optional: not importable here)" in log
    assert "swift ran" in (attempt_dir(sft) / "artifacts" / "training.log").read_text()

    assert grpo.state is RunState.FAILED
    assert grpo.current.reason is FailureReason.DEPENDENCY_MISSING
    assert grpo.current.message == "missing dependencies: msgspec, math_verify"


def test_a_model_path_missing_on_this_machine_is_refused_for_a_local_run(tmp_path: Path) -> None:
    from orbit.model.models import ExecutionRequest, LaunchMode, Placement, Resources

    def check(model: str, kind: str) -> None:
        execution = ExecutionRequest(
            template_id="t",
            placement=Placement(kind=kind),
            launch_mode=LaunchMode(kind="host_process"),
            target=None,
            detach=True,
            resources=Resources(gpu_count=0),
            runtime_env={},
            stop_grace_s=10,
        )
        request = {"mode": "sft", "model": model, "dataset": ["d"]}
        TaskRegistry().check_resources("swift", request, "spec.yaml", execution)

    missing = str(tmp_path / "no-such-model")
    with pytest.raises(InvalidInput) as exc:
        check(missing, "local")
    assert str(exc.value) == (
        f"task.model: no such path on this machine, where a local run reads it: {missing}"
    )
    check(str(tmp_path), "local")  # there: fine
    check(missing, "agent_pool")  # a node's path is the node's to find
    check("Qwen/Qwen2.5-0.5B", "local")  # a hub id

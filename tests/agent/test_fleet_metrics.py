"""/metrics as a fleet dashboard reads it, from a real `orbit server` and a real `orbit agent`
that sees two H100s (the replay of a real machine's NVML): the process and the build, nodes by
condition, GPUs by state and how busy each is (from the agent's heartbeats), runs waiting by tier
and how long runs waited to be placed. No run id in any label."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from orbit.model.version import __version__
from tests.agent.test_gpus import H100, HOLD, submit, wait_running
from tests.agent.test_pool_runs import ended
from tests.agents import AgentProc, nvml_env, wait_online
from tests.helpers import eventually, orbit
from tests.orbit_server import Server


def scrape(server: Server) -> dict[str, float]:
    """Each sample as `name{label="value",...}` -> value."""
    with server.client() as http:
        text = http.get("/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_metrics_show_nodes_gpus_the_queue_and_waits_without_ids(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(H100))
    wait_online(orbit_server, "h100x2")
    flag = tmp_path / "go"
    holding = submit(orbit_server, tmp_path, HOLD.format(flag=flag), gpu_count=1)
    wait_running(orbit_server, agent, holding)
    waiting = submit(orbit_server, tmp_path, "echo never", "--queue-anyway", gpu_count=3)

    def waits() -> dict[str, float] | None:
        found = scrape(orbit_server)
        return found if found.get('orbit_runs_waiting{tier="normal"}') == 1 else None

    seen = eventually(waits, timeout=30, every=0.5)
    assert seen['orbit_gpus{state="in_use"}'] == 1 and seen['orbit_gpus{state="free"}'] == 1
    assert seen['orbit_gpus{state="unhealthy"}'] == 0
    assert seen['orbit_nodes{condition="ready"}'] == 1
    assert seen['orbit_queue_wait_seconds_count{tier="normal"}'] >= 1  # the holding run's
    assert seen['orbit_queue_wait_seconds_bucket{le="43200.0",tier="normal"}'] >= 1
    assert seen["process_cpu_seconds_total{}"] > 0 and seen["process_open_fds{}"] > 0

    # each GPU's utilization as the agent's last heartbeat said (the recording's NVML)
    def utilization() -> dict[str, float] | None:
        found = scrape(orbit_server)
        busy = {k: v for k, v in found.items() if k.startswith("orbit_gpu_utilization_ratio{")}
        return busy or None

    busy = eventually(utilization, timeout=30, every=0.5)
    assert set(busy) == {
        f'orbit_gpu_utilization_ratio{{gpu="{i}",node="h100x2"}}' for i in (0, 1)
    }, busy
    assert all(0.0 <= v <= 1.0 for v in busy.values())
    build = [k for k in seen if k.startswith("orbit_build_info{")]
    assert len(build) == 1 and f'version="{__version__}"' in build[0], build
    # once it ends, nothing is in use and the tier's waiting count is the one left
    flag.touch()
    assert ended(orbit_server, holding)["attempts"][-1]["state"] == "succeeded"
    eventually(lambda: scrape(orbit_server)['orbit_gpus{state="free"}'] == 2, timeout=30)
    orbit(orbit_server.env(), "cancel", waiting)
    eventually(lambda: scrape(orbit_server)['orbit_runs_waiting{tier="normal"}'] == 0, 30)
    with orbit_server.client() as http:
        text = http.get("/metrics").text
    for run_id in (holding, waiting):
        assert run_id not in text and run_id[4:] not in text

"""/metrics beyond the API's own: what a dashboard of the fleet and the queue wants. The process
and platform (prometheus_client's own collectors), ORBIT's build, nodes by condition and GPUs
by state (counted from the store when scraped), and from each scheduler pass: runs waiting by
tier and how long a run waited to be placed (a histogram with Kueue's kind of buckets, 1 s to
12 h); and each online node's GPU utilization as its agent last said. No label holds a run id
or a user: names of tiers, conditions, states, nodes and GPU indices only."""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from orbit.model.version import __version__
from orbit.store import Store

# 1 s, doubling, to 12 h (Kueue's admission wait buckets run to about as far)
WAIT_BUCKETS = (*(float(2**i) for i in range(16)), 43200.0)
GPU_STATES = ("free", "in_use", "unhealthy")


class NodesAndGpus(Collector):
    """Nodes by condition (as `orbit nodes list` says it) and their GPUs by state."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()  # registering reads nothing

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nodes, gpus = self._families()
        at = datetime.now(UTC)
        conditions: Counter[str] = Counter()
        states: Counter[str] = Counter()
        for node in self.store.nodes.list_nodes():
            condition = node.condition(at).split(" ")[0]  # "cordoned (free)": cordoned
            conditions[condition] += 1
            if condition in ("revoked", "offline"):
                continue  # its GPUs are nobody's to count on
            for gpu in node.info.get("accelerators", ()):
                states[_gpu_state(gpu, node.gpus_in_use)] += 1
        for condition, count in sorted(conditions.items()):
            nodes.add_metric([condition], count)
        for state in GPU_STATES:
            gpus.add_metric([state], states[state])
        yield nodes
        yield gpus

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "orbit_nodes",
                "Nodes by condition: ready, busy, cordoned, draining, drained, offline, revoked.",
                labels=["condition"],
            ),
            GaugeMetricFamily(
                "orbit_gpus",
                "GPUs of the nodes online, by state: free, in_use (work placed there), "
                "unhealthy (NVML's word: no work goes there).",
                labels=["state"],
            ),
        )


class GpuUtilization(Collector):
    """Each online node's GPUs, busy how much (0-1) as the node's last heartbeat said
    (NVML's utilization.gpu), labelled by the node's name and the GPU's index."""

    def __init__(self, store: Store, last: Callable[[], dict[str, dict[int, float]]]) -> None:
        self.store, self.last = store, last

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        said = self.last()
        if said:
            at = datetime.now(UTC)
            for node in self.store.nodes.list_nodes():
                if node.id in said and node.online(at):
                    for index, percent in sorted(said[node.id].items()):
                        family.add_metric([node.name, str(index)], percent / 100.0)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "orbit_gpu_utilization_ratio",
            "How busy each GPU of an online node was (0-1), as its last heartbeat said.",
            labels=["node", "gpu"],
        )


def _gpu_state(gpu: dict[str, Any], in_use: dict[int, float]) -> str:
    if not gpu.get("healthy", True):
        return "unhealthy"
    return "in_use" if int(gpu.get("index", -1)) in in_use else "free"


class FleetMetrics:
    """The families above on `registry`, and what a scheduler pass tells (`observe_pass`)."""

    def __init__(self, registry: CollectorRegistry, store: Store) -> None:
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_open_fds, ...
        PlatformCollector(registry=registry)  # python_info
        Info("orbit_build", "ORBIT's version and the Python it runs on.", registry=registry).info(
            {"version": __version__, "python": platform.python_version()}
        )
        registry.register(NodesAndGpus(store))
        self.waiting = Gauge(
            "orbit_runs_waiting",
            "Runs waiting to be placed on agent nodes, by tier, as of the last scheduler pass.",
            ["tier"],
            registry=registry,
        )
        self.waited = Histogram(
            "orbit_queue_wait_seconds",
            "How long a run waited from its submission (or its retry) to its placement, by tier.",
            ["tier"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self._tiers: set[str] = set()

    def observe_pass(self, decisions: dict[str, dict[str, Any]]) -> None:
        """One pass's decisions: each placed run's wait observed, the rest counted waiting (a
        tier with none waiting any more shows 0, not its last count)."""
        waiting: Counter[str] = Counter({tier: 0 for tier in self._tiers})
        for record in decisions.values():
            tier = str(record.get("tier", ""))
            if record.get("outcome") == "placed":
                self.waited.labels(tier).observe(float(record.get("waited_s", 0.0)))
            else:
                waiting[tier] += 1
        for tier, count in waiting.items():
            self.waiting.labels(tier).set(count)
        self._tiers |= set(waiting)

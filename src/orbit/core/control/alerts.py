"""Alerts as the clients see them: listed (open, or all), acknowledged and silenced (the server
checks that an admin asks); and the same conditions as Prometheus alerting rules over the
names /metrics exports, for sites that run Alertmanager. The server's own loop raises and
resolves them (orbit.server.alerts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orbit.core.control.base import ServicePart
from orbit.model.alerts import AlertRecord, AlertsConfig
from orbit.model.errors import InvalidInput

MAX_SILENCE = timedelta(days=90)


class AlertsPart(ServicePart):
    def list_alerts(self, include_resolved: bool = False) -> list[AlertRecord]:
        return self.store.alerts.list_alerts(include_resolved)

    def acknowledge_alert(self, alert_id: int) -> AlertRecord:
        return self.store.alerts.acknowledge(alert_id, self.actor)

    def silence_alert(self, alert_id: int, duration: timedelta) -> AlertRecord:
        """No delivery about it (its resolution included) for `duration`."""
        if not timedelta(0) < duration <= MAX_SILENCE:
            raise InvalidInput(f"--for: between 1s and {MAX_SILENCE.days}d")
        return self.store.alerts.silence(alert_id, datetime.now(UTC) + duration, self.actor)

    def alert_rules(self) -> str:
        return prometheus_rules(AlertsConfig())


def prometheus_rules(config: AlertsConfig) -> str:
    """A Prometheus rules file of the conditions that /metrics shows: the fleet's own series,
    and for what only the server's loop judges (a stalled run, a starved user, a disk, the
    audit chain) its open alerts (orbit_alerts_open). A run retried too often is the server's
    own alert alone."""
    wait = int(config.run_waiting_s)
    rules = [
        ("OrbitNodeOffline", 'orbit_nodes{condition="offline"} > 0', "2m", "critical",
         "{{ $value }} node(s) offline",
         "check the agents (orbit nodes list; systemctl status orbit-agent on the node); what "
         "ran there is retried elsewhere once given up on; orbit nodes drain NODE stops "
         "placing work there"),
        ("OrbitGpuUnhealthy", 'orbit_gpus{state="unhealthy"} > 0', "1m", "critical",
         "{{ $value }} GPU(s) unhealthy (XID, ECC, fallen off the bus)",
         "orbit alerts list names the node and GPU; drain it: orbit nodes drain NODE"),
        ("OrbitRunsWaitLong",
         f"histogram_quantile(0.99, sum by (le) (rate(orbit_queue_wait_seconds_bucket[30m])))"
         f" > {wait}", "10m", "warning",
         f"runs wait more than {wait}s to be placed",
         "orbit queue shows why each waits; orbit explain RUN for one"),
        ("OrbitReconcileErrors", "increase(orbit_reconcile_errors_total[10m]) > 0", "0m",
         "warning", "the server's looks at runs fail",
         "see the server's log; orbit runs list --state running for the runs concerned"),
        # the conditions only the server judges (its loop), as the alerts it has open
        ("OrbitRunStalled", 'orbit_alerts_open{kind="run_stalled"} > 0', "0m", "warning",
         "{{ $value }} running run(s) logging no progress (hung, holding GPUs)",
         "orbit alerts list names them; orbit logs RUN --tail 50, then orbit cancel RUN"),
        ("OrbitUserStarved", 'orbit_alerts_open{kind="user_starved"} > 0', "0m", "warning",
         "{{ $value }} user(s) waiting while under their quota",
         "orbit queue and orbit explain RUN say what holds the GPUs; a quota's weight or "
         "preemption gives them their share"),
        ("OrbitNodeDiskLow", 'orbit_alerts_open{kind="disk_low"} > 0', "0m", "warning",
         "{{ $value }} node(s) nearly out of disk in their work dir",
         "orbit gc frees ended runs' files; orbit nodes drain NODE until it is cleaned"),
        ("OrbitAuditBroken", 'orbit_alerts_open{kind="audit_broken"} > 0', "0m", "critical",
         "the audit chain fails its check",
         "orbit audit verify says where; compare with a checkpoint (--anchor FILE)"),
    ]  # fmt: skip
    import yaml

    group = {
        "name": "orbit",
        "rules": [
            {
                "alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
                "annotations": {"summary": summary, "remedy": remedy},
            }
            for name, expr, for_, severity, summary, remedy in rules
        ],
    }  # fmt: skip
    text = yaml.safe_dump({"groups": [group]}, sort_keys=False, width=1000)
    return "# ORBIT's alert conditions over the names /metrics exports\n" + text

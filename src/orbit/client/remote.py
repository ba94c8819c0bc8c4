"""The control plane over HTTP: ControlAPI spoken to `orbit server`. It returns the records the
service returns and raises the errors it raised (problem details name them), so that a client
of ControlAPI, the CLI first, cannot tell this from the service in its own process. The
requests go through orbit.client.session; a submission's inputs go up by orbit.client.uploads,
a log and artifacts come down as orbit.client.streams, a node's files move by
orbit.client.node_files; the long transfers tell their bytes to the Meter it was given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from orbit.client.meter import QUIET, Meter
from orbit.client.node_files import pull_file, push_file
from orbit.client.remote_accounts import RemoteAccounts
from orbit.client.remote_alerts import RemoteAlerts
from orbit.client.remote_catalogue import RemoteCatalogue
from orbit.client.remote_groups import RemoteGroups
from orbit.client.remote_policy import RemotePolicy
from orbit.client.session import RESEND_S, Session, part, query
from orbit.client.streams import collect_artifacts, stream_log
from orbit.client.uploads import upload
from orbit.core.control.views import (
    Explanation,
    HostCheck,
    LogChunk,
    LogPlace,
    QueueEntry,
    QuotaView,
    RunDiff,
    RunPage,
    RunView,
    SchedConfigView,
    Simulation,
    SubmitPlan,
)
from orbit.core.control.waiting import wait_until_ended
from orbit.forensics.diagnose import Inspection
from orbit.model.audit_chain import Anchor, ChainCheck
from orbit.model.bulk import BulkResult, RunSelection
from orbit.model.clusters import ClusterCheck, ClusterRecord, ClusterSpec
from orbit.model.errors import NotFound
from orbit.model.hosts import HostRecord, HostSpec
from orbit.model.layers import LogLayer
from orbit.model.models import ExecutionOverrides, RunState, TaskSubmission
from orbit.model.nodes import JoinTokenRecord, NewJoinToken, NodeRecord
from orbit.model.records import AuditEvent, CollectResult, RunRecord
from orbit.model.storage import GcReport, RunStorage, Usage


class RemoteControl:
    """ControlAPI at `url`, shown `token`; its transfers tell `meter` how far they got."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout_s: float = 600.0,
        resend_s: float = RESEND_S,
        meter: Meter = QUIET,
    ) -> None:
        self.session = Session(url, token, timeout_s=timeout_s, resend_s=resend_s)
        self.url = self.session.url
        self.meter = meter
        accounts = RemoteAccounts(self.session)  # users, tokens, secrets: remote_accounts.py
        self.whoami = accounts.whoami
        self.sign_in_link = accounts.sign_in_link
        self.list_users = accounts.list_users
        self.add_user = accounts.add_user
        self.remove_user = accounts.remove_user
        self.set_role = accounts.set_role
        self.roles = accounts.roles
        self.create_token = accounts.create_token
        self.list_tokens = accounts.list_tokens
        self.revoke_token = accounts.revoke_token
        self.set_secret = accounts.set_secret
        self.list_secrets = accounts.list_secrets
        self.remove_secret = accounts.remove_secret
        self.rotate_secret_key = accounts.rotate_secret_key
        policy = RemotePolicy(self.session)  # the site's policy: remote_policy.py
        self.check_policy = policy.check_policy
        self.diff_policy = policy.diff_policy
        self.apply_policy = policy.apply_policy
        self.show_policy = policy.show_policy
        self.review_policy = policy.review_policy
        alerts = RemoteAlerts(self.session)  # the server's alerts: remote_alerts.py
        self.list_alerts = alerts.list_alerts
        self.acknowledge_alert = alerts.acknowledge_alert
        self.silence_alert = alerts.silence_alert
        self.alert_rules = alerts.alert_rules
        self.policy_history = policy.policy_history
        catalogue = RemoteCatalogue(self.session)  # templates, experiments: remote_catalogue.py
        self.list_templates = catalogue.list_templates
        self.get_template = catalogue.get_template
        self.create_experiment = catalogue.create_experiment
        self.list_experiments = catalogue.list_experiments
        self.get_experiment = catalogue.get_experiment
        self.set_experiment = catalogue.set_experiment
        groups = RemoteGroups(self.session, self.meter)  # sweeps and their groups: remote_groups.py
        self.submit_sweep = groups.submit_sweep
        self.list_groups = groups.list_groups
        self.get_group = groups.get_group
        self.group_view = groups.group_view

    def close(self) -> None:
        self.session.close()

    # -- submitting ------------------------------------------------------------------------
    def submit_task(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> RunRecord:
        return upload(
            self.session,
            RunRecord,
            "/runs",
            submission,
            base_dir,
            source,
            makes_run=True,
            meter=self.meter,
        )

    def plan_submission(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> SubmitPlan:
        return upload(
            self.session, SubmitPlan, "/runs/plan", submission, base_dir, source, meter=self.meter
        )

    # -- runs ----------------------------------------------------------------------------
    def get_run(self, ref: str) -> RunRecord:
        return self.session.get(RunRecord, f"/runs/{part(ref)}")

    def refresh_run_status(self, ref: str) -> RunRecord:
        return self.session.post(RunRecord, f"/runs/{part(ref)}/refresh")

    def wait_for(self, ref: str, timeout_s: float | None = None, poll_s: float = 0.5) -> RunRecord:
        """The run once it ended, or as it stands after `timeout_s` seconds."""
        return wait_until_ended(self.refresh_run_status, ref, timeout_s, poll_s)

    def run_view(self, ref: str, *, refresh: bool = True, images: bool = False) -> RunView:
        return self.session.get(RunView, f"/runs/{part(ref)}/view", refresh=refresh, images=images)

    def run_page(
        self,
        *,
        experiment: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
        user: str | None = None,
        node: str | None = None,
        mine: bool = False,
        group: str | None = None,
    ) -> RunPage:
        state = sorted(s.value for s in states) if states else None
        return self.session.get(
            RunPage,
            "/runs",
            experiment=experiment,
            state=state,
            limit=limit,
            user=user,
            node=node,
            mine=mine or None,
            group=group,
        )

    def cancel_run(self, ref: str, wait_s: float | None = None) -> RunRecord:
        return self.session.post(RunRecord, f"/runs/{part(ref)}/cancel", {"wait_s": wait_s})

    def retry_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        return self.session.post(RunRecord, f"/runs/{part(ref)}/retry", _overrides(overrides))

    def replay_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        response = self.session.send_once(
            "POST", f"/runs/{part(ref)}/replay", json=_overrides(overrides)
        )
        return RunRecord.model_validate_json(response.content)

    def cancel_runs(self, selection: RunSelection, *, dry_run: bool = False) -> BulkResult:
        return self.session.post(BulkResult, "/runs/cancel", _bulk(selection, dry_run))

    def retry_runs(self, selection: RunSelection, *, dry_run: bool = False) -> BulkResult:
        return self.session.post(BulkResult, "/runs/retry", _bulk(selection, dry_run))

    def stop_leftovers(self, ref: str) -> int:
        response = self.session.send("POST", f"/runs/{part(ref)}/leftovers/stop")
        return int(response.json()["stopped"])

    def inspect_run(self, ref: str, attempt: int | None = None) -> Inspection:
        return self.session.get(Inspection, f"/runs/{part(ref)}/inspect", attempt=attempt)

    def diff_runs(self, ref_a: str, ref_b: str) -> RunDiff:
        return self.session.get(RunDiff, "/diff", a=ref_a, b=ref_b)

    # -- logs ------------------------------------------------------------------------------
    def read_log(
        self, ref: str, layer: LogLayer, offset: int = 0, attempt: int | None = None
    ) -> LogChunk:
        parts: list[bytes] = []
        chunk = self.stream_log(ref, layer, offset, parts.append, attempt)
        return chunk.model_copy(update={"data": b"".join(parts)})

    def find_log_start(
        self,
        ref: str,
        layer: LogLayer,
        *,
        lines: int | None = None,
        since: datetime | None = None,
        attempt: int | None = None,
    ) -> LogPlace:
        path = f"/runs/{part(ref)}/logs/{layer.value}/start"
        when = since.isoformat() if since is not None else None
        return self.session.get(LogPlace, path, lines=lines, since=when, attempt=attempt)

    def stream_log(
        self,
        ref: str,
        layer: LogLayer,
        offset: int,
        sink: Callable[[bytes], None],
        attempt: int | None = None,
        only_attempt: str | None = None,
        follow: bool = False,
    ) -> LogChunk:
        return stream_log(self.session, ref, layer, offset, sink, attempt, only_attempt, follow)

    # -- artifacts -----------------------------------------------------------------------
    def collect_run_artifacts(
        self, ref: str, dest: Path, attempt: int | None = None
    ) -> CollectResult:
        return collect_artifacts(self.session, ref, dest, attempt, self.meter)

    # -- storage ---------------------------------------------------------------------------
    def run_storage(self, ref: str) -> RunStorage:
        return self.session.get(RunStorage, f"/runs/{part(ref)}/storage")

    def pin_run(self, ref: str, pinned: bool = True) -> RunStorage:
        method = "POST" if pinned else "DELETE"
        response = self.session.send(method, f"/runs/{part(ref)}/pin")
        return RunStorage.model_validate_json(response.content)

    def delete_runs(self, refs: Sequence[str], dry_run: bool = False) -> GcReport:
        return self.session.post(GcReport, "/runs/delete", {"runs": list(refs), "dry_run": dry_run})

    def collect_garbage(self, dry_run: bool = False) -> GcReport:
        return self.session.post(GcReport, "/gc", {"dry_run": dry_run})

    def usage(self) -> Usage:
        return self.session.get(Usage, "/usage")

    # -- the audit trail -------------------------------------------------------------------
    def audit(self, run: str | None = None, limit: int | None = None) -> list[AuditEvent]:
        return self.session.get_list(AuditEvent, "/audit", run=run, limit=limit)

    def verify_audit(self, anchors: Sequence[Anchor] = ()) -> ChainCheck:
        params = {"anchor": [str(a) for a in anchors]} if anchors else None
        data = self.session.send("GET", "/audit/verify", params=params).json()
        return ChainCheck(
            events=data["events"],
            head=data["head"],
            problems=tuple(data["problems"]),
            keyed_from=data.get("keyed_from"),
            key_id=data.get("key_id"),
        )

    # -- SSH hosts -------------------------------------------------------------------------
    def add_host(self, spec: HostSpec, *, check: bool = True) -> HostRecord:
        body = {"spec": spec.model_dump(mode="json", exclude_unset=True), "check": check}
        return self.session.post(HostRecord, "/hosts", body)

    def list_hosts(self) -> list[HostRecord]:
        return self.session.get_list(HostRecord, "/hosts")

    def get_host(self, name: str) -> HostRecord:
        return self.session.get(HostRecord, f"/hosts/{part(name)}")

    def check_host(self, name: str) -> HostCheck:
        return self.session.post(HostCheck, f"/hosts/{part(name)}/check")

    def remove_host(self, name: str) -> list[str]:
        response = self.session.send("DELETE", f"/hosts/{part(name)}")
        return list(response.json()["stopped_attempts"])

    # -- Slurm clusters --------------------------------------------------------------------
    def add_cluster(self, spec: ClusterSpec, *, check: bool = True) -> ClusterRecord:
        body = {"spec": spec.model_dump(mode="json", exclude_unset=True), "check": check}
        return self.session.post(ClusterRecord, "/clusters", body)

    def list_clusters(self) -> list[ClusterRecord]:
        return self.session.get_list(ClusterRecord, "/clusters")

    def get_cluster(self, name: str) -> ClusterRecord:
        return self.session.get(ClusterRecord, f"/clusters/{part(name)}")

    def check_cluster(self, name: str, *, sweep: bool = False) -> ClusterCheck:
        return self.session.post(ClusterCheck, f"/clusters/{part(name)}/check", {"sweep": sweep})

    def remove_cluster(self, name: str) -> list[str]:
        response = self.session.send("DELETE", f"/clusters/{part(name)}")
        return list(response.json()["stopped_attempts"])

    # -- agent nodes -----------------------------------------------------------------------
    def create_join_token(
        self, labels: dict[str, str] | None = None, expires: str | None = None
    ) -> NewJoinToken:
        body = {"labels": labels or {}, "expires": expires}
        return self.session.post(NewJoinToken, "/nodes/join-tokens", body)

    def list_join_tokens(self) -> list[JoinTokenRecord]:
        return self.session.get_list(JoinTokenRecord, "/nodes/join-tokens")

    def revoke_join_token(self, token_id: str) -> None:
        self.session.send("DELETE", f"/nodes/join-tokens/{part(token_id)}")

    def _node(self, ref: str) -> str:
        """A node's name or id as a path segment. /nodes/join-tokens is the join tokens' own
        path: a node of that name is reached by its id."""
        if ref == "join-tokens":
            found = [n.id for n in self.list_nodes() if n.name == ref]
            if not found:
                raise NotFound(f"no node '{ref}' (see `orbit nodes list`)")
            ref = found[0]
        return part(ref)

    # -- the scheduler ----------------------------------------------------------------------
    def explain(self, ref: str, replay: bool = False) -> Explanation:
        return self.session.get(Explanation, f"/runs/{ref}/explain", replay=replay or None)

    def queue(self) -> list[QueueEntry]:
        return self.session.get_list(QueueEntry, "/queue")

    def list_quotas(self) -> list[QuotaView]:
        return self.session.get_list(QuotaView, "/quotas")

    def set_quota(self, scope: str, name: str, gpus: int, weight: float = 1.0) -> QuotaView:
        body = {"gpus": gpus, "weight": weight}
        content = self.session.send("PUT", f"/quotas/{scope}/{name}", json=body).content
        return QuotaView.model_validate_json(content)

    def remove_quota(self, scope: str, name: str) -> None:
        self.session.send("DELETE", f"/quotas/{scope}/{name}")

    def simulate(self, since_s: float, config: dict[str, Any]) -> Simulation:
        return self.session.post(
            Simulation, "/sched/simulate", {"since_s": since_s, "config": config}
        )

    def scheduler_config_view(self) -> SchedConfigView:
        return self.session.get(SchedConfigView, "/sched/config")

    def set_scheduler_config(self, text: str) -> SchedConfigView:
        content = self.session.send("PUT", "/sched/config", json={"text": text}).content
        return SchedConfigView.model_validate_json(content)

    def list_nodes(self) -> list[NodeRecord]:
        return self.session.get_list(NodeRecord, "/nodes")

    def get_node(self, ref: str) -> NodeRecord:
        return self.session.get(NodeRecord, f"/nodes/{self._node(ref)}")

    def set_node(
        self,
        ref: str,
        *,
        cordon: bool | None = None,
        max_tasks: int | None = None,
        reason: str | None = None,
    ) -> NodeRecord:
        body = {"cordon": cordon, "max_tasks": max_tasks, "reason": reason}
        return self.session.post(NodeRecord, f"/nodes/{self._node(ref)}", body)

    def revoke_node(self, ref: str) -> NodeRecord:
        return self.session.post(NodeRecord, f"/nodes/{self._node(ref)}/revoke")

    def remove_node(self, ref: str, force: bool = False) -> NodeRecord:
        response = self.session.send(
            "DELETE", f"/nodes/{self._node(ref)}", params=query({"force": force})
        )
        return NodeRecord.model_validate_json(response.content)

    def push_file(self, ref: str, data: bytes, dest: str) -> dict[str, object]:
        return push_file(self.session, self._node(ref), data, dest, self.meter)

    def pull_file(self, ref: str, path: str) -> bytes:
        return pull_file(self.session, self._node(ref), path, self.meter)


def _bulk(selection: RunSelection, dry_run: bool) -> dict[str, Any]:
    """The body of /runs/cancel and /runs/retry: the selection's fields, and dry_run."""
    return {**selection.model_dump(mode="json", exclude_defaults=True), "dry_run": dry_run}


def _overrides(overrides: ExecutionOverrides | None) -> dict[str, Any]:
    if overrides is None:
        return {}
    return {"overrides": overrides.model_dump(mode="json", exclude_unset=True)}

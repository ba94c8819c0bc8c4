"""CoreControlService: the one API the CLI, the HTTP server, the Python client and the web page
all call. Its parts live beside it, one concern each: submit (validate, shape, freeze),
launching (claim, stage, start; dependencies holds a launch back on `after:`; leases: who
holds a launch), lifecycle (look, end, retry), scheduling (passes; sched_queries: explain,
queue, quotas, simulate), actions (cancel, retry, replay; bulk: of many runs at once),
reading (views, logs, evidence, inspect, diff, collect), storage (pin, delete, gc, usage),
accounts, secrets, policy, alerts, nodes, clusters, hosts and experiments; this module adds
the templates and the audit trail, and builds the whole from settings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orbit.core.control.accounts import Accounts
from orbit.core.control.actions import RunActions
from orbit.core.control.alerts import AlertsPart
from orbit.core.control.attempt_files import AttemptFiles
from orbit.core.control.base import ServiceConfig, Shared, acting_as, current_actor
from orbit.core.control.bulk import BulkActions
from orbit.core.control.clusters import Clusters
from orbit.core.control.dependencies import DependencyGate
from orbit.core.control.experiments import Experiments
from orbit.core.control.host_registry import HostRegistry
from orbit.core.control.hosts import Hosts
from orbit.core.control.launching import Launching
from orbit.core.control.lifecycle import Lifecycle
from orbit.core.control.nodes import Nodes
from orbit.core.control.parts import Parts
from orbit.core.control.policy import PolicyPart
from orbit.core.control.reading import Reading
from orbit.core.control.sched_queries import SchedulerQueries
from orbit.core.control.scheduling import Scheduling
from orbit.core.control.secrets import SecretsPart
from orbit.core.control.storage import Storage
from orbit.core.control.sweeps import Sweeping
from orbit.core.control.views import SchedConfigView, TemplateView
from orbit.model.hosts import HostRecord
from orbit.model.records import AuditEvent
from orbit.model.signals import Signal
from orbit.model.sweeps import MAX_POINTS

if TYPE_CHECKING:  # what only some commands need is loaded by them
    from orbit.core.control.sched_config import LiveSchedConfig
    from orbit.core.execution.backends.base import ProcessSweep
    from orbit.core.execution.backends.pool_nodes import NodeWakes
    from orbit.core.execution.docker.host import SweepResult
    from orbit.core.execution.service import ExecutionService
    from orbit.core.execution.ssh.transport import SshOptions
    from orbit.core.tasks import TaskRegistry
    from orbit.model.audit_chain import Anchor, ChainCheck
    from orbit.model.config import Settings
    from orbit.model.retention import Retention
    from orbit.model.templates import TemplateRegistry, TemplateSource
    from orbit.store import Store


def _default_ssh_options() -> SshOptions:
    from orbit.core.execution.ssh.transport import SshOptions

    return SshOptions()


class CoreControlService:
    """Built from its parts, each a class of its own module made here with what every part
    shares (base.Shared) and the five the others call (parts.Parts); each call of the API is
    one part's method, named below by the part it lives in.
    This module adds the catalogue (templates, experiments, the audit trail)."""

    acting_as = staticmethod(acting_as)

    def __init__(
        self,
        store: Store,
        execution: ExecutionService,
        templates: TemplateRegistry | Callable[[], TemplateRegistry],
        tasks: TaskRegistry | None,
        bundles_dir: Path,
        actor: str | None = None,
        ssh_options: SshOptions | Callable[[], SshOptions] | None = None,
        config: ServiceConfig | None = None,
        wakes: NodeWakes | None = None,
    ) -> None:
        """`templates` and `ssh_options` may be functions and `tasks` None: each is then made
        the first time a command needs it, not by every command. `wakes`: the signal the
        execution plane's pool backends send when they queue a node's command."""
        self.store = store
        self.execution = execution
        self.bundles_dir = bundles_dir
        self.config = config or ServiceConfig()
        self.wakes: NodeWakes = wakes if wakes is not None else Signal()
        self.hosts = HostRegistry(
            store,
            ssh_options if ssh_options is not None else _default_ssh_options,
            lambda: self.actor,
            sweep=self._sweep_host,
            sweep_processes=self._sweep_host_processes,
        )
        self.shared = shared = Shared(
            store,
            execution,
            templates,
            tasks,
            bundles_dir,
            actor or current_actor(),
            self.config,
            self.wakes,
            self.hosts,
        )
        self.pass_wanted = shared.pass_wanted
        self.parts = parts = Parts()  # what the parts call of one another
        parts.gate = DependencyGate(shared, parts)
        parts.launching = Launching(shared, parts)
        parts.lifecycle = lifecycle = Lifecycle(shared, parts)
        parts.scheduling = self._scheduling = scheduling = Scheduling(shared, parts)
        parts.actions = actions = RunActions(shared, parts)
        reading = Reading(shared, parts)
        files = AttemptFiles(shared, parts)
        submitting = Sweeping(shared, parts)  # submits one run, or a sweep's group of runs
        bulk = BulkActions(shared, parts)
        storage = Storage(shared, parts)
        sched_queries = SchedulerQueries(shared, parts)
        accounts = Accounts(shared, parts)
        nodes = Nodes(shared, parts)
        clusters = Clusters(shared, parts)
        hosts = Hosts(shared, parts)
        experiments = Experiments(shared, parts)
        parts.secrets = secrets = SecretsPart(shared, parts)
        parts.policy = policy = PolicyPart(shared, parts)
        alerts = AlertsPart(shared, parts)
        # runs read: views, logs, evidence, inspect, diff, collect (reading.py)
        self.get_run = reading.get_run
        self.list_runs = reading.list_runs
        self.run_page = reading.run_page
        self.run_view = reading.run_view
        self.waits_of = reading.waits_of
        self.progress = reading.progress
        self.evidence = reading.evidence
        self.inspect_run = reading.inspect_run
        self.diff_runs = reading.diff_runs
        # what the console reads of an attempt's folder (attempt_files.py)
        self.charts = files.charts
        self.gpu_window = files.gpu_window
        self.artifacts = files.artifacts
        self.artifact = files.artifact
        self.previews = files.previews
        self.preview = files.preview
        self.log_before = files.log_before
        self.log_follower = files.log_follower
        self.read_log = reading.read_log
        self.stream_log = reading.stream_log
        self.find_log_start = reading.find_log_start
        self.collect_run_artifacts = reading.collect_run_artifacts
        # submit (submit.py)
        self.submit_task = submitting.submit_task
        self.submit_staged = submitting.submit_staged
        self.plan_staged = submitting.plan_staged
        self.plan_submission = submitting.plan_submission
        # sweeps and the groups of runs they make (sweeps.py)
        self.submit_sweep = submitting.submit_sweep
        self.submit_sweep_staged = submitting.submit_sweep_staged
        self.list_groups = submitting.list_groups
        self.get_group = submitting.get_group
        self.group_view = submitting.group_view
        # cancel, retry, replay (actions.py)
        self.cancel_run = actions.cancel_run
        self.ask_to_cancel = actions.ask_to_cancel
        self.stop_leftovers = actions.stop_leftovers
        self.retry_run = actions.retry_run
        self.replay_run = actions.replay_run
        # of the runs a filter selects (bulk.py)
        self.cancel_runs = bulk.cancel_runs
        self.retry_runs = bulk.retry_runs
        # look, wait (lifecycle.py)
        self.refresh_run_status = lifecycle.refresh_run_status
        self.wait_for = lifecycle.wait_for
        self.refresh_active = lifecycle.refresh_active
        # passes (scheduling.py)
        self.schedule_pass = scheduling.schedule_pass
        self.request_schedule = scheduling.request_schedule
        # explain, queue, quotas, simulate (sched_queries.py)
        self.explain = sched_queries.explain
        self.queue = sched_queries.queue
        self.list_quotas = sched_queries.list_quotas
        self.set_quota = sched_queries.set_quota
        self.remove_quota = sched_queries.remove_quota
        self.simulate = sched_queries.simulate
        self.gpu_hours = sched_queries.gpu_hours
        self.gpus_held = sched_queries.gpus_held
        # pin, delete, gc, usage (storage.py)
        self.run_storage = storage.run_storage
        self.pin_run = storage.pin_run
        self.delete_runs = storage.delete_runs
        self.collect_garbage = storage.collect_garbage
        self.gc_if_due = storage.gc_if_due
        self.usage = storage.usage
        self.plan_collect = storage.plan_collect
        # users and tokens (accounts.py)
        self.whoami = accounts.whoami
        self.list_users = accounts.list_users
        self.add_user = accounts.add_user
        self.remove_user = accounts.remove_user
        self.set_role = accounts.set_role
        self.roles = accounts.roles
        self.create_token = accounts.create_token
        self.list_tokens = accounts.list_tokens
        self.revoke_token = accounts.revoke_token
        # secrets: sealed under the key set, listed without values (secrets.py)
        self.set_secret = secrets.set_secret
        self.list_secrets = secrets.list_secrets
        self.remove_secret = secrets.remove_secret
        self.resolve_secrets = secrets.resolve_secrets
        self.open_secrets = secrets.open_secrets
        self.rotate_secret_key = secrets.rotate_secret_key
        self.check_secret_keys = secrets.check_secret_keys
        self.deliver_secrets = secrets.deliver
        # policies: checked, replayed, applied, in force at each submit (policy.py)
        self.check_policy = policy.check_policy
        self.diff_policy = policy.diff_policy
        self.apply_policy = policy.apply_policy
        self.show_policy = policy.show_policy
        self.review_policy = policy.review_policy
        # alerts: listed, acknowledged, silenced; the server's loop raises them (alerts.py)
        self.list_alerts = alerts.list_alerts
        self.acknowledge_alert = alerts.acknowledge_alert
        self.silence_alert = alerts.silence_alert
        self.alert_rules = alerts.alert_rules
        self.policy_history = policy.policy_history
        # join tokens, nodes, their files (nodes.py)
        self.create_join_token = nodes.create_join_token
        self.list_join_tokens = nodes.list_join_tokens
        self.revoke_join_token = nodes.revoke_join_token
        self.list_nodes = nodes.list_nodes
        self.get_node = nodes.get_node
        self.set_node = nodes.set_node
        self.revoke_node = nodes.revoke_node
        self.remove_node = nodes.remove_node
        self.push_file = nodes.push_file
        self.pull_file = nodes.pull_file
        # experiments, restricted ones and their members (experiments.py)
        self.create_experiment = experiments.create_experiment
        self.list_experiments = experiments.list_experiments
        self.get_experiment = experiments.get_experiment
        self.set_experiment = experiments.set_experiment
        # SSH hosts (hosts.py)
        self.add_host = hosts.add_host
        self.list_hosts = hosts.list_hosts
        self.get_host = hosts.get_host
        self.check_host = hosts.check_host
        self.remove_host = hosts.remove_host
        # Slurm clusters (clusters.py)
        self.add_cluster = clusters.add_cluster
        self.list_clusters = clusters.list_clusters
        self.get_cluster = clusters.get_cluster
        self.check_cluster = clusters.check_cluster
        self.remove_cluster = clusters.remove_cluster

    @property
    def actor(self) -> str:
        return self.shared.actor

    @property
    def templates(self) -> TemplateRegistry:
        return self.shared.templates

    @property
    def tasks(self) -> TaskRegistry:
        return self.shared.tasks

    @property
    def live_config(self) -> LiveSchedConfig:
        return self._scheduling.live_config

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        cwd: Path | None = None,
        actor: str | None = None,
        live_templates: bool = False,
        looks_on_read: bool = True,
        retention: Retention | None = None,
        secret_keys_file: Path | None = None,
        max_sweep_points: int = MAX_POINTS,
    ) -> CoreControlService:
        """`live_templates`: see templates added or changed after the service was made (a
        server), rather than those there when first asked (a command). `looks_on_read`,
        `retention`, `secret_keys_file` and `max_sweep_points`: see ServiceConfig (a server's
        loops look; its config's storage rules, key file and limits.sweep_points)."""
        from orbit.core.execution.service import ExecutionService
        from orbit.model.private import private_home
        from orbit.store import Store

        private_home(settings.home)
        folder = cwd or Path.cwd()

        def templates() -> TemplateRegistry:
            from orbit.model.templates import TemplateRegistry, default_search_path

            search = default_search_path(settings.templates_dir, folder)
            return TemplateRegistry(search, live=live_templates)

        def ssh_options() -> SshOptions:
            from orbit.core.execution.ssh.transport import options_for

            return options_for(settings)

        from orbit.model.audit_key import load_audit_key
        from orbit.model.retention import config_file

        store = Store(
            settings.database_url,
            audit_key=load_audit_key(settings.audit_key_file),
            pool_size=settings.database_pool_size,
        )
        wakes: NodeWakes = Signal()
        return cls(
            store=store,
            execution=ExecutionService.default(settings, store.hosts, store, wakes),
            templates=templates,
            tasks=None,
            bundles_dir=settings.bundles_dir,
            actor=actor,
            ssh_options=ssh_options,
            config=ServiceConfig(
                looks_on_read=looks_on_read,
                node_offline_s=settings.node_offline_s,
                lost_retry_floor_s=settings.lost_retry_floor_s,
                scheduler_config_file=settings.scheduler_config,
                scheduler_config_named=settings.scheduler_config_named,
                storage_config_file=config_file(settings.home),
                retention=retention,
                secret_keys_file=secret_keys_file or settings.secret_keys_file,
                max_sweep_points=max_sweep_points,
            ),
            wakes=wakes,
        )

    def _sweep_host(self, host: HostRecord, known: set[str]) -> SweepResult:
        from orbit.core.execution.backends.ssh_docker import SshDockerBackend

        backend = self.execution.backend("ssh_docker")
        assert isinstance(backend, SshDockerBackend)
        return backend.sweep(host, known)

    def _sweep_host_processes(self, host: HostRecord, known: set[str]) -> ProcessSweep:
        from orbit.core.execution.backends.ssh_host_process import SshHostProcessBackend

        backend = self.execution.backend("ssh_host_process")
        assert isinstance(backend, SshHostProcessBackend)
        return backend.sweep_processes(host, known)

    # --- templates ------------------------------------------------------------------------

    def _template_view(self, source: TemplateSource) -> TemplateView:
        from orbit.core.execution.service import canonical_placement

        return TemplateView(
            template=source.template,
            path=source.path,
            text=Path(source.path).read_text(encoding="utf-8"),
            canonical_placement=canonical_placement(source.template.placement.kind),
        )

    def list_templates(self) -> list[TemplateView]:
        return [self._template_view(s) for s in self.templates.all()]

    def get_template(self, template_id: str) -> TemplateView:
        return self._template_view(self.templates.source(template_id))

    # --- the audit trail ------------------------------------------------------------------

    def audit(self, run: str | None = None, limit: int | None = None) -> list[AuditEvent]:
        run_id = self.store.runs.resolve_run_id(run) if run else None
        return self.store.audit.list_events(run_id=run_id, limit=limit)

    def verify_audit(self, anchors: Sequence[Anchor] = ()) -> ChainCheck:
        """Walk the audit trail's hash chain: how many events, the head digest, every problem
        (MACs and seal under the audit key; each anchor still in the chain with its hash)."""
        return self.store.audit.check_audit(anchors)

    # --- the scheduler config -------------------------------------------------------------

    def scheduler_config_view(self) -> SchedConfigView:
        from orbit.core.control.sched_config import view_of

        return view_of(self._scheduling.live_config, self._scheduling.quotas())

    def set_scheduler_config(self, text: str) -> SchedConfigView:
        """Validate a scheduler config and make it the live one (its file and the store),
        audited with the caller and the diff; a refused one changes nothing."""
        self._scheduling.live_config.set_text(text, self.actor)
        self.request_schedule()  # the new tiers, weights or quotas may place a run now
        return self.scheduler_config_view()

    def close(self) -> None:
        self.store.close()

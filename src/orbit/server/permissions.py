"""The one permission each route of the API and the console needs, in one table per surface,
checked before the route runs (routes.common's gates, dependencies of every API and console
router). A route not in its table is refused to everyone: a new route is closed until it is
given a permission here. What a route checks beyond its gate is finer, never other: whose run
it is (a `.own` permission, or its `.any`), and a shared secret's scope."""

from __future__ import annotations

from fastapi import Request
from fastapi.routing import APIRoute

from orbit.model.errors import Forbidden

# routes open to anyone (no token) or to agents only (node credentials, not users' tokens)
OPEN, AGENT = "open", "agent"

# the API's routes, by operation id (openapi.OPERATION_IDS)
API: dict[str, str] = {
    "runs_submit": "runs.submit",
    "runs_plan": "runs.submit",
    "runs_replay": "runs.submit",
    "runs_list": "runs.read",
    "runs_get": "runs.read",
    "runs_view": "runs.read",
    "runs_refresh": "runs.read",
    "runs_explain": "runs.read",
    "runs_diff": "runs.read",
    "queue_list": "runs.read",
    "experiments_list": "runs.read",
    "experiments_create": "runs.submit",
    "experiments_get": "runs.read",
    "experiments_set": "experiments.manage",
    "templates_list": "runs.read",
    "templates_get": "runs.read",
    "runs_cancel": "runs.cancel.own",
    "runs_cancel_many": "runs.cancel.own",
    "runs_stop_leftovers": "runs.cancel.own",
    "runs_retry": "runs.retry.own",
    "runs_retry_many": "runs.retry.own",
    "runs_logs": "logs.read.own",
    "runs_log_start": "logs.read.own",
    "runs_inspect": "logs.read.own",
    "runs_collect": "artifacts.read.own",
    "runs_download_artifacts": "artifacts.read.own",
    "storage_of_run": "storage.read",
    "storage_usage": "storage.read",
    "storage_pin": "storage.keep.own",
    "storage_unpin": "storage.keep.own",
    "storage_delete_runs": "storage.keep.own",
    "storage_gc": "storage.gc",
    "hosts_list": "fleet.read",
    "hosts_get": "fleet.read",
    "clusters_list": "fleet.read",
    "clusters_get": "fleet.read",
    "hosts_add": "hosts.manage",
    "hosts_remove": "hosts.manage",
    "hosts_check": "hosts.manage",
    "clusters_add": "hosts.manage",
    "clusters_remove": "hosts.manage",
    "clusters_check": "hosts.manage",
    "nodes_list": "fleet.read",
    "nodes_get": "fleet.read",
    "nodes_set": "nodes.manage",
    "nodes_remove": "nodes.manage",
    "nodes_revoke": "nodes.manage",
    "nodes_pull": "nodes.files",
    "nodes_push": "nodes.files",
    "join_tokens_list": "nodes.join",
    "join_tokens_create": "nodes.join",
    "join_tokens_revoke": "nodes.join",
    "quotas_list": "fleet.read",
    "sched_config_get": "fleet.read",
    "sched_simulate": "fleet.read",
    "quotas_set": "quotas.write",
    "quotas_remove": "quotas.write",
    "sched_config_put": "quotas.write",
    "users_whoami": "account.self",
    "users_console_link": "account.self",
    "users_roles": "account.self",
    "tokens_list": "account.self",
    "tokens_create": "account.self",
    "tokens_revoke": "account.self",
    "users_list": "users.manage",
    "users_add": "users.manage",
    "users_set": "users.manage",
    "users_remove": "users.manage",
    "secrets_list": "secrets.read",
    "secrets_set": "secrets.write",
    "secrets_remove": "secrets.write",
    "secrets_rotate_key": "secrets.rotate",
    "policy_show": "policy.read",
    "policy_history": "policy.read",
    "policy_version": "policy.read",
    "policy_check": "policy.read",
    "policy_diff": "policy.write",
    "policy_review": "policy.write",
    "policy_apply": "policy.write",
    "alerts_list": "alerts.read",
    "alerts_rules": "alerts.read",
    "alerts_acknowledge": "alerts.manage",
    "alerts_silence": "alerts.manage",
    "audit_list": "audit.read",
    "audit_verify": "audit.read",
    "server_health": OPEN,
    "server_metrics": "metrics.read",
    **{
        f"agent_{name}": AGENT
        for name in (
            "register",
            "poll",
            "claim",
            "report",
            "heartbeat",
            "sync",
            "bundle",
            "attempt_file",
            "transfer",
            "transfer_done",
        )
    },
    "openapi_get": "account.self",  # the document itself (not in it)
}

# the console's routes, by name (each unique among them)
CONSOLE: dict[str, str] = {
    "root": OPEN,
    "login_form": OPEN,
    "login": OPEN,
    "logout": OPEN,
    "sign_in_link_form": OPEN,
    "sign_in_link": OPEN,
    "overview": "runs.read",
    "runs": "runs.read",
    "rows": "runs.read",
    "run": "runs.read",
    "summary": "runs.read",
    "decision": "runs.read",
    "charts": "logs.read.own",
    "queue": "runs.read",
    "events": "runs.read",
    "follow": "logs.read.own",
    "download": "logs.read.own",
    "older": "logs.read.own",
    "diff": "runs.read",
    "artifacts": "artifacts.read.own",
    "artifact": "artifacts.read.own",
    "previews": "artifacts.read.own",
    "preview": "artifacts.read.own",
    "run_cancel": "runs.cancel.own",
    "run_retry": "runs.retry.own",
    "run_replay": "runs.submit",
    "nodes": "fleet.read",
    "node": "fleet.read",
    "node_set": "nodes.manage",
    "fair_share": "fleet.read",
    "alerts": "alerts.read",
    "alert_ack": "alerts.manage",
    "alert_silence": "alerts.manage",
    "audit": "audit.read",
    "admin": "users.manage",
    "token_made": "account.self",
    "token_revoke": "account.self",
    "join_token_made": "nodes.join",
    "quota_set": "quotas.write",
    "quota_remove": "quotas.write",
}


def route_of(request: Request) -> APIRoute:
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):  # a gate runs only as a dependency of a route
        raise Forbidden("no route")
    return route

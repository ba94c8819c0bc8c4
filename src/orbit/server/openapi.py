"""The API's OpenAPI document as client generators and operators read it: operation ids named
like methods (`runs_list`, `runs_cancel`), tags that say what each group is, a bearer scheme
every call needs but /healthz, one `Problem` component that every error answer refers to, and
the agent protocol marked internal (agents speak it; scripts have no business there).

The ids are a table, not derived from the handlers' Python names, so that renaming a function
never renames a generated client's method."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from orbit.server import permissions
from orbit.server.problems import PROBLEM, PROBLEM_SCHEMA, TITLES

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
AGENT_TAG = "agent-protocol"
OPEN = frozenset({"/healthz"})  # answered without a token

# what each status means here, beside its title (problems.TITLES)
WHY = {
    400: "the request is malformed",
    401: "no valid token (WWW-Authenticate: Bearer)",
    403: "the token's role may not do this",
    404: "no such thing, or not visible to this token",
    409: "refused in the present state (the detail says why and what to do)",
    413: "the body or an upload is over the server's limit",
    422: "invalid input: `field` names it",
    429: "this address failed to authenticate too often: try again after Retry-After seconds",
    502: "a host behind the server did not answer",
    503: "the server's store failed, or its disk is short of room",
    507: "the server's disk is full",
}

# the handler's name -> the operation's id (tests/server/test_openapi.py: one per route)
OPERATION_IDS = {
    # runs
    "submit": "runs_submit",
    "list_runs": "runs_list",
    "get_run": "runs_get",
    "run_view": "runs_view",
    "cancel": "runs_cancel",
    "cancel_many": "runs_cancel_many",
    "retry": "runs_retry",
    "retry_many": "runs_retry_many",
    "replay": "runs_replay",
    "refresh": "runs_refresh",
    "plan": "runs_plan",
    "collect": "runs_collect",
    "collect_all": "runs_download_artifacts",
    "stop_leftovers": "runs_stop_leftovers",
    "logs": "runs_logs",
    "log_start": "runs_log_start",
    "explain": "runs_explain",
    "inspect": "runs_inspect",
    "diff": "runs_diff",
    # groups
    "submit_sweep": "groups_submit",
    "list_groups": "groups_list",
    "get_group": "groups_get",
    "group_view": "groups_view",
    # storage
    "pin": "storage_pin",
    "unpin": "storage_unpin",
    "run_storage": "storage_of_run",
    "delete_runs": "storage_delete_runs",
    "gc": "storage_gc",
    "usage": "storage_usage",
    # catalogue
    "list_experiments": "experiments_list",
    "create_experiment": "experiments_create",
    "get_experiment": "experiments_get",
    "set_experiment": "experiments_set",
    "list_templates": "templates_list",
    "get_template": "templates_get",
    # hosts and clusters
    "list_hosts": "hosts_list",
    "add_host": "hosts_add",
    "get_host": "hosts_get",
    "remove_host": "hosts_remove",
    "check_host": "hosts_check",
    "list_clusters": "clusters_list",
    "add_cluster": "clusters_add",
    "get_cluster": "clusters_get",
    "remove_cluster": "clusters_remove",
    "check_cluster": "clusters_check",
    # nodes
    "list_nodes": "nodes_list",
    "get_node": "nodes_get",
    "set_node": "nodes_set",
    "remove_node": "nodes_remove",
    "revoke_node": "nodes_revoke",
    "pull_file": "nodes_pull",
    "push_file": "nodes_push",
    "list_join_tokens": "join_tokens_list",
    "create_join_token": "join_tokens_create",
    "revoke_join_token": "join_tokens_revoke",
    # scheduling
    "queue": "queue_list",
    "list_quotas": "quotas_list",
    "set_quota": "quotas_set",
    "remove_quota": "quotas_remove",
    "show": "sched_config_get",
    "put": "sched_config_put",
    "simulate": "sched_simulate",
    # users and tokens
    "whoami": "users_whoami",
    "console_link": "users_console_link",
    "roles": "users_roles",
    "list_users": "users_list",
    "add_user": "users_add",
    "set_user": "users_set",
    "remove_user": "users_remove",
    "list_tokens": "tokens_list",
    "create_token": "tokens_create",
    "revoke_token": "tokens_revoke",
    # secrets
    "list_secrets": "secrets_list",
    "set_secret": "secrets_set",
    "remove_secret": "secrets_remove",
    "rotate_key": "secrets_rotate_key",
    # policy
    "show_policy": "policy_show",
    "policy_history": "policy_history",
    "policy_version": "policy_version",
    "check_policy": "policy_check",
    "diff_policy": "policy_diff",
    "apply_policy": "policy_apply",
    "review_policy": "policy_review",
    # alerts
    "list_alerts": "alerts_list",
    "acknowledge_alert": "alerts_acknowledge",
    "silence_alert": "alerts_silence",
    "alert_rules": "alerts_rules",
    # audit
    "audit": "audit_list",
    "verify": "audit_verify",
    # the server itself
    "healthz": "server_health",
    "metrics_text": "server_metrics",
    # the agent protocol
    "register": "agent_register",
    "poll": "agent_poll",
    "claim": "agent_claim",
    "report": "agent_report",
    "heartbeat": "agent_heartbeat",
    "sync": "agent_sync",
    "bundle": "agent_bundle",
    "attempt_file": "agent_attempt_file",
    "transfer": "agent_transfer",
    "transfer_done": "agent_transfer_done",
}

TAGS: list[dict[str, Any]] = [
    {"name": "runs", "description": "Submit runs, follow them, cancel, retry and replay them."},
    {"name": "groups", "description": "Sweeps: a group of runs, one per point, made in one call."},
    {"name": "logs", "description": "A run's layered logs, read or followed from an offset."},
    {"name": "forensics", "description": "Walk a run's evidence, or diff two runs."},
    {"name": "storage", "description": "Bytes kept per run: pins, deletion, retention, usage."},
    {"name": "catalogue", "description": "Experiments and execution templates."},
    {"name": "hosts", "description": "SSH hosts that runs can target."},
    {"name": "clusters", "description": "Slurm clusters that runs can target."},
    {"name": "nodes", "description": "In-house GPU servers running agents; their join tokens."},
    {"name": "scheduler", "description": "The queue, why a run waits, quotas and the policy."},
    {"name": "users", "description": "Users, roles and API tokens."},
    {"name": "secrets", "description": "Secrets set and listed, never read back; key rotation."},
    {"name": "policy", "description": "Submission rules in CEL: checked, replayed, applied."},
    {"name": "alerts", "description": "Conditions that need a person, with their remedies."},
    {"name": "audit", "description": "The tamper-evident audit trail."},
    {"name": "server", "description": "Health (no token needed) and Prometheus metrics."},
    {
        "name": AGENT_TAG,
        "description": "Internal: what `orbit agent` speaks to the server (register, poll, "
        "report, transfers). Authenticated by node credentials, not API tokens; not for "
        "scripts, and free to change with the agent.",
        "x-internal": True,
    },
]


def operation_id(route: APIRoute) -> str:
    """The table's id for a route (the app's generate_unique_id_function); a route missing
    there still gets a unique one."""
    methods = "_".join(sorted(route.methods or ())).lower()
    return OPERATION_IDS.get(route.name) or f"{route.name}_{methods}"


def document(app: FastAPI) -> dict[str, Any]:
    """Build the document once and keep it (FastAPI's own cache)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        routes=app.routes,
        tags=TAGS,
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = {
        **PROBLEM_SCHEMA,
        "title": "Problem",
        "description": "Problem details (RFC 9457): `detail` is the one line the CLI prints, "
        "`error` names ORBIT's error class, `field` the input at fault where there is one.",
    }
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (`orbit tokens create`), sent as "
            "`Authorization: Bearer TOKEN`.",
        }
    }
    doc["security"] = [{"bearer": []}]
    for path, item in doc.get("paths", {}).items():
        for operation in item.values():
            _problems_by_reference(operation, components.setdefault("responses", {}))
            if path in OPEN:
                operation["security"] = []
            if AGENT_TAG in operation.get("tags", []):
                operation["x-internal"] = True
            # the one permission the route checks (orbit.server.permissions; `orbit users
            # roles` says which roles hold it): `open` needs no token, `agent` a node's
            operation["x-permission"] = permissions.API.get(operation.get("operationId", ""))
    for unused in ("HTTPValidationError", "ValidationError"):  # answered as a Problem instead
        schemas.pop(unused, None)
    app.openapi_schema = doc
    return doc


def _problems_by_reference(operation: dict[str, Any], answers: dict[str, Any]) -> None:
    """Every 4xx/5xx answer is a Problem, and each status one shared response component
    (`#/components/responses/Status404`): FastAPI's own 422 included, as the server answers a
    validation error as a Problem naming the field, not with FastAPI's schema."""
    for code in list(operation.get("responses", {})):
        if str(code)[:1] not in ("4", "5"):
            continue
        name = f"Status{code}"
        if name not in answers:
            title = TITLES.get(int(code), "Error")
            answers[name] = {
                "description": f"{title}: {WHY.get(int(code), 'a problem (RFC 9457)')}",
                "content": {PROBLEM: {"schema": PROBLEM_REF}},
            }
        operation["responses"][code] = {"$ref": f"#/components/responses/{name}"}

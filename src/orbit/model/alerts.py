"""Alerts: conditions of the fleet and its runs that need a person, each with the objects it
concerns and a remedy in words; raised once while the condition holds (one open alert per
key), resolved when it stops holding, acknowledged or silenced by an admin; and the server
config that sets their thresholds and where they are delivered (webhooks)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from orbit.model.models import Record, Strict

Severity = Literal["critical", "warning"]


class Webhook(Strict):
    """Where alerts are posted: `json` (the alert as JSON) or `slack` (an incoming webhook's
    {"text": ...})."""

    url: str = Field(pattern=r"^https?://\S+$")
    kind: Literal["json", "slack"] = "json"
    timeout_s: float = Field(default=5.0, gt=0, le=60)


class AlertsConfig(Strict):
    """The server config's `alerts:`."""

    every_s: float = Field(default=15.0, gt=0, le=3600)  # how often the conditions are looked at
    run_waiting_s: float = Field(default=3600.0, gt=0)  # a run not placed after this long
    retries_over: int = Field(default=3, ge=1)  # a run on more attempts than this, still going
    # a running run whose logging.jsonl has not moved for this long (a hung job on a GPU); only
    # runs that log progress, whose files are on the server (agent pools, local)
    no_progress_s: float = Field(default=1800.0, gt=0)
    # a user whose runs have waited this long to be placed while they hold fewer GPUs than
    # their quota (or, with no quota, no GPU at all); runs held on their dependencies aside
    starved_s: float = Field(default=1800.0, gt=0)
    disk_free_mb: int = Field(default=10_240, ge=0)  # a node with less free in its work dir
    audit_every_s: float = Field(default=3600.0, gt=0)  # how often the audit chain is verified
    webhooks: list[Webhook] = []
    tries: int = Field(default=5, ge=1, le=20)  # a delivery tried this often, backing off


class Firing(Record):
    """A condition that holds now (orbit.server.alerts.conditions)."""

    key: str  # what the one open alert of it is known by: "node-offline:gpu-07"
    kind: str
    severity: Severity
    objects: dict[str, str]  # {"node": "gpu-07"}, {"run": "run-..."}
    message: str
    remedy: str


class AlertRecord(Record):
    id: int
    key: str
    kind: str
    severity: Severity
    objects: dict[str, str]
    message: str
    remedy: str
    raised_at: datetime
    resolved_at: datetime | None = None
    acked_by: str | None = None
    acked_at: datetime | None = None
    silenced_until: datetime | None = None  # no delivery about it until then

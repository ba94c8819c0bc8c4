"""`orbit alerts`: what the server raised for a person to look at (nodes gone silent, GPUs
NVML gave up on, runs waiting or retried too long), each with its remedy; acknowledge and
silence them; and the same conditions as Prometheus rules."""

from __future__ import annotations

import typer

from orbit.cli.common import JSON, console, print_json, service
from orbit.cli.text import Table

alerts_app = typer.Typer(
    help="Alerts the server raises on its own loop, each with what to do about it, delivered "
    "to the webhooks of its config (alerts.webhooks: json or slack).",
    no_args_is_help=True,
)


@alerts_app.command("list")
def alerts_list(
    all_: bool = typer.Option(False, "--all", help="Resolved ones too (the last 500)."),
    as_json: bool = JSON,
) -> None:
    """Open alerts, newest first: severity, what is wrong and the remedy."""
    found = service().list_alerts(all_)
    if as_json:
        print_json([a.model_dump(mode="json") for a in found])
        return
    if not found:
        console.print("no open alerts" if not all_ else "no alerts")
        return
    table = Table("ID", "SEVERITY", "RAISED", "STATE", "WHAT", "REMEDY")
    for a in found:
        state = "resolved" if a.resolved_at else ("acked" if a.acked_at else "open")
        if a.silenced_until is not None and a.resolved_at is None:
            state += f", silenced to {a.silenced_until:%m-%d %H:%M}"
        table.add_row(
            str(a.id), a.severity, f"{a.raised_at:%m-%d %H:%M}", state, a.message, a.remedy
        )
    console.print(table)


@alerts_app.command("ack")
def alerts_ack(alert_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Say that someone is on it (admins): recorded, with who, in the audit too."""
    done = service().acknowledge_alert(alert_id)
    console.print(f"alert {done.id} acknowledged by {done.acked_by}")


@alerts_app.command("silence")
def alerts_silence(
    alert_id: int = typer.Argument(..., metavar="ID"),
    for_: str = typer.Option(..., "--for", metavar="DURATION", help="2h, 1d, 30m."),
) -> None:
    """No delivery about alert ID (its resolution included) for a while (admins)."""
    from orbit.model.durations import parse_duration

    done = service().silence_alert(alert_id, parse_duration(for_, "--for"))
    assert done.silenced_until is not None
    console.print(f"alert {done.id} silenced until {done.silenced_until:%Y-%m-%d %H:%M} UTC")


@alerts_app.command("rules")
def alerts_rules() -> None:
    """The conditions /metrics shows, as a Prometheus alerting rules file (with the server's
    thresholds), for sites that run Alertmanager: orbit alerts rules > orbit-rules.yaml"""
    print(service().alert_rules(), end="")

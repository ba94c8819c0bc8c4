"""The server's alerts through `orbit server` (orbit.client.remote's RemoteControl names these
methods as its own)."""

from __future__ import annotations

from datetime import timedelta

from orbit.client.session import Session
from orbit.model.alerts import AlertRecord


class RemoteAlerts:
    def __init__(self, session: Session) -> None:
        self.session = session

    def list_alerts(self, include_resolved: bool = False) -> list[AlertRecord]:
        return self.session.get_list(AlertRecord, "/alerts", all=include_resolved or None)

    def acknowledge_alert(self, alert_id: int) -> AlertRecord:
        return self.session.post(AlertRecord, f"/alerts/{int(alert_id)}/ack")

    def silence_alert(self, alert_id: int, duration: timedelta) -> AlertRecord:
        body = {"for_s": duration.total_seconds()}
        return self.session.post(AlertRecord, f"/alerts/{int(alert_id)}/silence", body)

    def alert_rules(self) -> str:
        return str(self.session.send("GET", "/alerts/rules").text)

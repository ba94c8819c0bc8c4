"""Delivering alerts to webhooks: generic JSON (the alert, and whether it was raised or
resolved) or Slack-compatible ({"text": ...}); each delivery tried up to `tries` times with a
doubling backoff, on a thread of its own, so that a receiver that times out or answers 500
never holds up the server's loops. An alert is delivered once when raised and once when
resolved (the store raises it once), and not while it is silenced."""

from __future__ import annotations

import logging
import queue
import threading
from datetime import UTC, datetime
from typing import Any

import httpx

from orbit.model.alerts import AlertRecord, Webhook

log = logging.getLogger("orbit.server.alerts")

FIRST_WAIT_S = 1.0
MAX_WAIT_S = 60.0


def payload(hook: Webhook, event: str, alert: AlertRecord) -> dict[str, Any]:
    if hook.kind == "slack":
        mark = {"raised": ":rotating_light:", "resolved": ":white_check_mark:"}[event]
        text = f"{mark} [{alert.severity}] {alert.message}"
        if event == "raised":
            text += f"\n{alert.remedy}"
        return {"text": text}
    return {"event": event, "alert": alert.model_dump(mode="json")}


class Deliverer:
    def __init__(self, hooks: list[Webhook], tries: int) -> None:
        self.hooks = hooks
        self.tries = tries
        self._queue: queue.Queue[tuple[str, AlertRecord] | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alert-webhooks", daemon=True)

    def start(self) -> None:
        if self.hooks:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def send(self, event: str, alert: AlertRecord) -> None:
        """Queue a delivery (never waits); a silenced alert is not sent."""
        if not self.hooks:
            return
        if alert.silenced_until is not None and alert.silenced_until > datetime.now(UTC):
            return
        self._queue.put((event, alert))

    def _run(self) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set():
                item = self._queue.get()
                if item is None:
                    return
                event, alert = item
                for hook in self.hooks:
                    self._post(client, hook, event, alert)

    def _post(self, client: httpx.Client, hook: Webhook, event: str, alert: AlertRecord) -> None:
        wait = FIRST_WAIT_S
        for attempt in range(1, self.tries + 1):
            try:
                answer = client.post(
                    hook.url, json=payload(hook, event, alert), timeout=hook.timeout_s
                )
                if answer.status_code < 300:
                    return
                why = f"answered {answer.status_code}"
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempt == self.tries or self._stop.wait(wait):
                log.warning(
                    "alert %s (%s) not delivered to %s after %d tries: %s",
                    alert.id, event, hook.url, attempt, why,
                )  # fmt: skip
                return
            wait = min(wait * 2, MAX_WAIT_S)

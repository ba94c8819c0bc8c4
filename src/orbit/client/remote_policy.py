"""The site's policy through `orbit server` (orbit.client.remote's RemoteControl names these
methods as its own): a file is sent whole in a request's body, to be checked, replayed or
applied there."""

from __future__ import annotations

from datetime import timedelta

from orbit.client.session import Session
from orbit.core.control.views import PolicyReview
from orbit.model.policies import PolicyVersion
from orbit.policy.check import CheckReport
from orbit.policy.replay import DiffReport


class RemotePolicy:
    def __init__(self, session: Session) -> None:
        self.session = session

    def check_policy(self, text: str, source: str = "policy") -> CheckReport:
        return self.session.post(CheckReport, "/policy/check", {"text": text, "source": source})

    def diff_policy(
        self, text: str, source: str = "policy", since: timedelta = timedelta(days=30)
    ) -> DiffReport:
        body = {"text": text, "source": source, "since_s": since.total_seconds()}
        return self.session.post(DiffReport, "/policy/diff", body)

    def apply_policy(self, text: str, source: str = "policy") -> PolicyVersion:
        return self.session.post(
            PolicyVersion, "/policy/versions", {"text": text, "source": source}
        )

    def review_policy(self, version: int, since: timedelta = timedelta(days=30)) -> PolicyReview:
        return self.session.get(
            PolicyReview, f"/policy/versions/{int(version)}/review", since_s=since.total_seconds()
        )

    def show_policy(self, version: int | None = None) -> PolicyVersion:
        path = "/policy" if version is None else f"/policy/versions/{int(version)}"
        return self.session.get(PolicyVersion, path)

    def policy_history(self) -> list[PolicyVersion]:
        return self.session.get_list(PolicyVersion, "/policy/versions")

"""Policies: check a file, replay it against past submissions, apply it (the newest version is
in force), show and list the versions; and admit a submission under the policy in force: its
refusal in one line naming the rule, its warnings and the defaults it sets, recorded on the
run with the version (core/control/submit.py calls `admit`). Who may apply is the server's to
check (an admin); these only do it, for the caller, and the store audits it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from orbit.core.control.base import ServicePart
from orbit.core.control.views import PolicyReview
from orbit.model.errors import InvalidInput, Refused
from orbit.model.models import ExecutionRequest, ExecutionTemplate, TaskSubmission
from orbit.model.overrides import set_paths
from orbit.model.policies import PolicyStamp, PolicyVersion
from orbit.model.records import RunRecord
from orbit.policy.check import CheckReport, check_policy
from orbit.policy.engine import CompiledPolicy, Verdict, compile_policy, request_view, variables
from orbit.policy.replay import DiffReport, Recorded, diff
from orbit.policy.rules import parse_policy

MAX_SINCE = timedelta(days=400)


class PolicyPart(ServicePart):
    # the version in force, its record and its rules compiled, read again when it changes
    _compiled: tuple[PolicyVersion, CompiledPolicy] | None = None

    def check_policy(self, text: str, source: str = "policy") -> CheckReport:
        """The file read, compiled, type-checked and its tests run (InvalidInput in one line
        when it cannot be used; failing tests are in the report)."""
        return check_policy(text, source)[2]

    def diff_policy(
        self, text: str, source: str = "policy", since: timedelta = timedelta(days=30)
    ) -> DiffReport:
        """What the file would change, against every submission recorded in `since`."""
        if not timedelta(0) < since <= MAX_SINCE:
            raise InvalidInput(f"--since: between 1s and {MAX_SINCE.days}d")
        _, candidate, report = check_policy(text, source)
        current = self.store.policies.current()
        start = datetime.now(UTC) - since
        return diff(
            self._compile(current) if current is not None else None,
            current.version if current is not None else None,
            candidate,
            report.sha256,
            self._recorded(start),
            start,
        )

    def apply_policy(self, text: str, source: str = "policy") -> PolicyVersion:
        """The file as the next version, in force from the next submit; refused, nothing
        applied, when it cannot be used or one of its own tests fails."""
        policy, _, report = check_policy(text, source)
        failed = [t for t in report.tests if not t.passed]
        if failed:
            raise InvalidInput(
                f"{source}: test '{failed[0].name}' fails ({'; '.join(failed[0].failures)}): "
                "not applied (orbit policy check shows every test)"
            )
        return self.store.policies.apply(text, report.sha256, len(policy.rules), self.actor)

    def review_policy(self, version: int, since: timedelta = timedelta(days=30)) -> PolicyReview:
        """Version `version` as one document for a review: the file, its check, and its diff
        against the version before it over the submissions of `since` before it was applied
        (the same document whenever it is exported, but for runs deleted since)."""
        if not timedelta(0) < since <= MAX_SINCE:
            raise InvalidInput(f"--since: between 1s and {MAX_SINCE.days}d")
        target = self.store.policies.get(version)
        before = self.store.policies.get(version - 1) if version > 1 else None
        assert target.body is not None
        _, candidate, report = check_policy(target.body, f"policy version {version}")
        start = target.applied_at - since
        return PolicyReview(
            version=target,
            check=report,
            diff=diff(
                self._compile_file(before) if before is not None else None,
                before.version if before is not None else None,
                candidate,
                report.sha256,
                self._recorded(start, until=target.applied_at),
                start,
            ),
            window_end=target.applied_at,
        )

    def show_policy(self, version: int | None = None) -> PolicyVersion:
        if version is not None:
            return self.store.policies.get(version)
        found = self.store.policies.current()
        if found is None:
            raise InvalidInput("no policy applied yet (orbit policy apply FILE)")
        return found

    def policy_history(self) -> list[PolicyVersion]:
        return self.store.policies.history()

    def admit(
        self,
        request: ExecutionRequest,
        submission: TaskSubmission,
        template: ExecutionTemplate,
        experiment: str,
    ) -> tuple[ExecutionRequest, PolicyStamp]:
        """The request under the policy in force: Refused in one line naming the rule when a
        rule in enforce mode denies it; else the request with the defaults the rules set (where
        neither the submission nor its template gives one) and what the run records."""
        current = self._in_force()
        if current is None:  # who asked is kept all the same: a later diff replays it
            return request, PolicyStamp(role=self._role())
        verdict, role, usage = self._judge(current, request, submission, experiment)
        refusal = verdict.refusal()
        if refusal is not None:
            raise Refused(refusal)
        # given: set to a value by the submission or its template (a null is none given)
        named = set(set_paths(submission.overrides)) | template.defaults.model_fields_set
        defaults = {
            k: v
            for k, v in verdict.defaults.items()
            if k not in named or getattr(request, k) is None
        }
        replaced = {k: getattr(request, k) for k in defaults}
        if defaults:  # validated as any request is (rules.py checked their types)
            request = ExecutionRequest.model_validate({**request.model_dump(), **defaults})
        return request, self._stamp(current, verdict, defaults, replaced, role, usage)

    def _judge(
        self,
        current: PolicyVersion,
        request: ExecutionRequest,
        submission: TaskSubmission,
        experiment: str,
    ) -> tuple[Verdict, str, dict[str, Any]]:
        """The policy's verdict on a request by the caller: (verdict, their role, usage)."""
        compiled = self._compile(current)
        role = self._role()  # kept on the run, for a later diff to replay
        usage = self._usage() if "usage" in compiled.variables() else {}  # a read of the fleet
        view = request_view(
            request.model_dump(mode="json"), submission.task_type, submission.task_request
        )
        who = {"name": self.actor, "role": role}
        return compiled.evaluate(variables(view, who, experiment, _now(), usage)), role, usage

    def _stamp(
        self,
        current: PolicyVersion,
        verdict: Verdict,
        defaults: dict[str, Any],
        replaced: dict[str, Any],
        role: str,
        usage: dict[str, Any],
    ) -> PolicyStamp:
        compiled = self._compile(current)
        return PolicyStamp(
            version=current.version,
            warnings=[f"{rule}: {message}" for rule, message in verdict.warnings],
            audited={
                r.rule.name: verdict.outcomes.get(r.rule.name, "allow")
                for r in compiled.rules
                if r.rule.mode == "audit"
            },
            defaults=defaults,
            replaced=replaced,
            errors=[f"{rule}: {why}" for rule, why in verdict.errors],
            role=role,
            usage=usage,
        )

    def readmit(self, run: RunRecord, request: ExecutionRequest) -> PolicyStamp:
        """A retry or replay of `run` by the caller (the same bundle, so no default is set;
        its request with the retry's own target): refused in one line when the policy in
        force denies it, now and for this caller; what the policy says of it otherwise."""
        current = self._in_force()
        made_under = run.policy.version if run.policy is not None else None
        if current is None:
            return PolicyStamp(role=self._role())
        verdict, role, usage = self._judge(current, request, run.submission, run.experiment_name)
        refusal = verdict.refusal()
        if refusal is not None:
            was = f"version {made_under}" if made_under else "no policy"
            raise Refused(
                f"{refusal} (policy version {current.version}; {run.id} was made under {was})"
            )
        return self._stamp(current, verdict, {}, {}, role, usage)

    def _in_force(self) -> PolicyVersion | None:
        """The policy in force: its number read each time, its file only when it changed."""
        newest = self.store.policies.newest()
        if newest is None:
            return None
        cached = self._compiled
        if cached is not None and cached[0].version == newest:
            return cached[0]
        return self.store.policies.get(newest)

    def _compile(self, version: PolicyVersion) -> CompiledPolicy:
        cached = self._compiled
        if cached is not None and cached[0].version == version.version:
            return cached[1]
        compiled = self._compile_file(version)
        self._compiled = (version, compiled)
        return compiled

    def _role(self) -> str:
        from orbit.model.errors import NotFound

        try:
            return self.store.users.get_user(self.actor).role
        except NotFound:  # embedded: the local user, who may do anything
            return "admin"

    def _usage(self) -> dict[str, Any]:
        from orbit.model.models import RunState
        from orbit.scheduler.gpu_hours import gpus_of

        active = {RunState.PROVISIONING, RunState.STARTING, RunState.RUNNING}
        held = sum(
            gpus_of(request if isinstance(request, dict) else {})
            for user, _, request in self.store.runs.holding(active)
            if user == self.actor
        )
        quota = next(
            (int(q["gpus"]) for q in self.store.scheduling.list_quotas()
             if q["scope"] == "user" and q["name"] == self.actor),
            None,
        )  # fmt: skip
        return {"gpus": held, "quota_gpus": quota}

    @staticmethod
    def _compile_file(version: PolicyVersion) -> CompiledPolicy:
        assert version.body is not None
        source = f"policy version {version.version}"
        return compile_policy(parse_policy(version.body, source), source)

    def _recorded(self, since: datetime, until: datetime | None = None) -> Iterator[Recorded]:
        for row in self.store.policies.recorded_since(since, until):
            stamp = row["policy"] or {}
            submission = row["submission"] or {}
            # as it was asked: what a rule's default filled in is given back its own value
            request = {**row["request"], **(stamp.get("replaced") or {})}
            yield Recorded(
                run_id=row["id"],
                at=row["created_at"],
                user=row["created_by"],
                role=stamp.get("role", "member"),
                experiment=row["experiment"],
                request=request_view(
                    request, row["task_type"], submission.get("task_request") or {}
                ),
                usage=stamp.get("usage") or {},
            )


def _now() -> datetime:
    return datetime.now(UTC)

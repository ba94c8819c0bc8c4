"""Policies through the control service, on SQLite and PostgreSQL: a file's rules in each mode
against real submissions (the refusal names the rule and renders its message, a warning and an
audited outcome are recorded on the run, a default fills what the request does not give, the
version is recorded), files that cannot be used refused in one line naming rule and line with
nothing applied, a file's own tests, and `policy diff` against recorded submissions whose
answers are known."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.errors import InvalidInput, Refused
from orbit.model.models import ExecutionRequest, LaunchMode, Placement, TaskSubmission

POLICY = """\
rules:
  - name: batch-takes-two
    match: 'request.priority == "batch"'
    deny: 'request.resources.gpu_count > 2'
    message: 'batch runs take at most 2 GPUs (asked {{ request.resources.gpu_count }})'
    mode: enforce
  - name: cap-runtime
    set: {max_runtime_s: 259200}
  - name: many-cpus
    warn: 'request.resources.cpu_count > 1'
    message: '{{ user.name }} asks {{ request.resources.cpu_count }} CPUs'
  - name: gpus-seen
    deny: 'request.resources.gpu_count > 0'
    message: 'a GPU run'
    mode: audit
  - name: sleeping
    deny: 'true'
    message: 'never'
    mode: 'off'
tests:
  - name: big batch refused
    request: {priority: batch, resources: {gpu_count: 4}}
    expect: {batch-takes-two: deny, cap-runtime: set}
  - name: small batch goes
    request: {priority: batch, resources: {gpu_count: 2}}
    expect: {batch-takes-two: allow, gpus-seen: deny}
"""
# the same rules, letting batch runs take up to 8 GPUs (without the tests that say otherwise)
LOOSE = POLICY.replace("> 2", "> 8").split("tests:")[0]


@pytest.fixture
def svc(settings: Settings, tmp_path: Path) -> Any:
    templates = tmp_path / "execution_templates"
    templates.mkdir()
    (templates / "box.yaml").write_text(  # a local template that lets a spec set priority
        "id: box\nplacement: {kind: local}\nlaunch_mode: {kind: host_process}\n"
        "defaults: {target: localhost}\n"
        "allow_overrides: [priority, resources, runtime_env, max_runtime_s]\n"
    )
    service = CoreControlService.from_settings(settings, actor="mia")
    yield service
    service.close()


def submission(template: str = "box", **overrides: Any) -> TaskSubmission:
    """On `box` (this machine) or, for GPUs, queued in the agent pool (no node here)."""
    return TaskSubmission.model_validate(
        {
            "experiment_id": "llm",
            "task_type": "command",
            "task_request": {"command": "true"},
            "template_id": template,
            "overrides": overrides,
            "queue_anyway": template == "pool",
        }
    )


def test_each_mode_against_real_submissions_and_the_version_each_run_records(
    svc: CoreControlService, tmp_path: Path
) -> None:
    before = svc.submit_task(submission(), base_dir=tmp_path)
    assert before.policy is not None and before.policy.version is None  # none applied yet
    applied = svc.apply_policy(POLICY, "site.yaml")
    assert applied.version == 1 and applied.rules == 5
    with pytest.raises(Refused) as caught:
        svc.submit_task(submission(priority="batch", resources={"gpu_count": 4}), base_dir=tmp_path)
    assert str(caught.value) == (
        "policy rule 'batch-takes-two': batch runs take at most 2 GPUs (asked 4)"
    )
    assert len(svc.list_runs()) == 1  # nothing written for the refused one
    run = svc.submit_task(submission(resources={"cpu_count": 2}), base_dir=tmp_path)
    stamp = run.policy
    assert stamp is not None and stamp.version == 1
    assert stamp.warnings == ["many-cpus: mia asks 2 CPUs"]
    assert stamp.audited == {"gpus-seen": "allow"}
    assert stamp.defaults == {"max_runtime_s": 259200} and run.request.max_runtime_s == 259200
    given = svc.submit_task(submission(max_runtime_s=60), base_dir=tmp_path)
    assert given.request.max_runtime_s == 60 and given.policy.defaults == {}  # type: ignore[union-attr]
    gpu = svc.plan_submission(submission("pool", resources={"gpu_count": 1}), base_dir=tmp_path)
    assert gpu.policy.audited == {"gpus-seen": "deny"} and gpu.policy.version == 1
    # a new version is in force from the next submit; the runs keep theirs
    svc.apply_policy(LOOSE, "site.yaml")
    later = svc.submit_task(
        submission("pool", priority="batch", resources={"gpu_count": 4}), base_dir=tmp_path
    )
    assert later.policy.version == 2  # type: ignore[union-attr]
    assert svc.get_run(run.id).policy.version == 1  # type: ignore[union-attr]
    assert [v.version for v in svc.policy_history()] == [2, 1]
    assert svc.show_policy(1).body == POLICY and svc.show_policy().version == 2
    events = [e for e in svc.store.audit.list_events() if e.action == "policy.applied"]
    assert [e.data["version"] for e in events] == [1, 2]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("'request.priority == \"batch\"'", "'request.priority =='"),
         "rule 'batch-takes-two' (line 2): match: not CEL: "),
        (("gpu_count > 2", "gpu_cnt > 2"),
         "rule 'batch-takes-two' (line 2): deny: no field 'gpu_cnt' in request.resources"),
        (("request.resources.gpu_count > 2", "request.priority > 2"),
         "rule 'batch-takes-two' (line 2): deny: No such overload"),
        (("{{ user.name }}", "{{ usr.name }}"),
         "rule 'many-cpus' (line 9): message: unknown variable usr"),
        (("    message: 'a GPU run'\n", ""),
         "rule 'gpus-seen' (line 12): a rule with deny or warn needs a message"),
        (("mode: audit", "mode: loud"), "rule 'gpus-seen' (line 12): mode: "),
        (("set: {max_runtime_s: 259200}", "set: {gpus: 1}"),
         "rule 'cap-runtime' (line 7): set: 'gpus' cannot be set"),
        (("expect: {batch-takes-two: allow", "expect: {nope: allow"),
         "test 'small batch goes' expects of an unknown rule 'nope'"),
        (("set: {max_runtime_s: 259200}", "set: {stop_grace_s: 99999}"),
         "rule 'cap-runtime' (line 7): set: stop_grace_s: "),
        (("    mode: audit\n", "    mode: audit\n    set: {priority: batch}\n"),
         "rule 'gpus-seen' (line 12): a rule has deny or warn, or set, not both"),
        (("'request.priority == \"batch\"'", "r'C:\\' + request.prioity == 'x'"),
         "rule 'batch-takes-two' (line 2): match: no field 'prioity' in request"),
    ],
)  # fmt: skip
def test_a_file_that_cannot_be_used_is_refused_naming_rule_and_line_and_nothing_applied(
    svc: CoreControlService, change: tuple[str, str], says: str
) -> None:
    bad = POLICY.replace(*change)
    assert bad != POLICY
    for attempt in (svc.check_policy, svc.apply_policy):
        with pytest.raises(InvalidInput) as caught:
            attempt(bad, "site.yaml")
        line = str(caught.value)
        assert line.startswith("site.yaml") and says in line and "\n" not in line, line
    assert svc.policy_history() == []


def test_the_files_own_tests_run_and_a_failing_one_keeps_it_from_being_applied(
    svc: CoreControlService,
) -> None:
    report = svc.check_policy(POLICY, "site.yaml")
    assert report.passed and [t.name for t in report.tests] == [
        "big batch refused",
        "small batch goes",
    ]
    assert report.modes == {"off": 1, "audit": 1, "warn": 0, "enforce": 3}
    wrong = POLICY.replace("expect: {batch-takes-two: deny,", "expect: {batch-takes-two: allow,")
    failing = svc.check_policy(wrong, "site.yaml")
    assert not failing.passed
    assert failing.tests[0].failures == ["rule batch-takes-two gave deny, expected allow"]
    with pytest.raises(InvalidInput, match="test 'big batch refused' fails"):
        svc.apply_policy(wrong, "site.yaml")
    assert svc.policy_history() == []


def recorded(svc: CoreControlService, user: str, priority: str, gpus: int) -> str:
    """A submission recorded as a run, without running it."""
    experiment = svc.store.experiments.find_experiment(
        "llm"
    ) or svc.store.experiments.create_experiment("llm", user)
    request = ExecutionRequest(
        template_id="pool", placement=Placement(kind="agent_pool"),
        launch_mode=LaunchMode(kind="host_process"), target=None, detach=True,
        resources={"gpu_count": gpus}, runtime_env={}, stop_grace_s=10, priority=priority,
    )  # fmt: skip
    run = svc.store.runs.create_run(
        experiment_id=experiment.id, task_type="command", template_id="pool",
        bundle_digest="0" * 64, submission=submission(), request=request, actor=user,
    )  # fmt: skip
    return run.id


def test_diff_replays_recorded_submissions_with_known_answers(svc: CoreControlService) -> None:
    big = [recorded(svc, "ann", "batch", 4) for _ in range(3)]
    recorded(svc, "bob", "batch", 4)
    recorded(svc, "bob", "batch", 1)
    recorded(svc, "ann", "normal", 8)
    svc.apply_policy(LOOSE, "site.yaml")  # in force: nothing refused
    report = svc.diff_policy(POLICY, "site.yaml", timedelta(days=1))
    assert report.submissions == 6 and report.current_version == 1
    assert (report.refused_before, report.refused_after) == (0, 4)
    assert (report.newly_denied, report.newly_allowed) == (4, 0)
    change = {c.rule: c for c in report.changes}["batch-takes-two"]
    assert change.newly_denied == 4 and change.users == {"ann": 3, "bob": 1}
    assert change.experiments == {"llm": 4} and change.examples == big
    # the other way round: what the candidate lets through
    svc.apply_policy(POLICY, "site.yaml")
    back = svc.diff_policy(LOOSE, "site.yaml", timedelta(days=1))
    assert (back.newly_denied, back.newly_allowed) == (0, 4)
    # outside the window: nothing to replay
    with pytest.raises(InvalidInput, match="--since"):
        svc.diff_policy(POLICY, "site.yaml", timedelta(days=999))


def test_a_retry_or_replay_of_a_run_made_under_an_older_version_meets_the_one_in_force(
    svc: CoreControlService, tmp_path: Path
) -> None:
    svc.apply_policy(LOOSE, "site.yaml")
    run = svc.submit_task(submission("box", resources={"cpu_count": 3}), base_dir=tmp_path)
    run = svc.wait_for(run.id, timeout_s=60)
    assert run.policy.version == 1  # type: ignore[union-attr]
    again = svc.wait_for(svc.retry_run(run.id).id, timeout_s=60)  # the same version: as before
    assert len(again.attempts) == 2
    svc.apply_policy(LOOSE + """\
  - name: three-cpus-at-most
    deny: 'request.resources.cpu_count > 2'
    message: 'at most 2 CPUs'
""", "site.yaml")  # fmt: skip
    for act in (svc.retry_run, svc.replay_run):
        with pytest.raises(Refused) as caught:
            act(run.id)
        assert str(caught.value) == (
            f"policy rule 'three-cpus-at-most': at most 2 CPUs (policy version 2; {run.id} was "
            "made under version 1)"
        )
    assert len(svc.get_run(run.id).attempts) == 2 and len(svc.list_runs()) == 1


GUARDED = """\
rules:
  - name: long-runs-labelled
    match: 'request.max_runtime_s != null'
    deny: 'request.max_runtime_s > 259200 && !("APPROVED" in request.env)'
    message: >
      runs over 72 h need APPROVED
      in their env
  - name: needs-lr
    deny: 'double(request.env.LR) > 0.1'
    message: 'LR at most 0.1'
tests:
  - name: a task without LR cannot be judged
    request: {}
    expect: {needs-lr: error}
  - name: long and unapproved
    request: {max_runtime_s: 300000, env: {LR: "0.01"}}
    expect: {long-runs-labelled: deny, needs-lr: allow}
"""


def test_guards_errors_and_messages_as_a_rule_writer_expects(
    svc: CoreControlService, settings: Settings, tmp_path: Path
) -> None:
    report = svc.check_policy(GUARDED, "site.yaml")  # a match that guards a null is no error
    assert report.passed, report.tests
    svc.apply_policy(GUARDED, "site.yaml")
    with pytest.raises(Refused) as caught:  # a condition that fails counts as on_error: deny
        svc.submit_task(submission(), base_dir=tmp_path)
    assert str(caught.value).startswith("policy rule 'needs-lr': could not be evaluated: ")
    lr = {"command": "true", "env": {"LR": "0.01"}}
    long = submission(max_runtime_s=300000).model_copy(update={"task_request": lr})
    with pytest.raises(Refused) as caught:
        svc.submit_task(long, base_dir=tmp_path)
    assert str(caught.value) == (  # a folded YAML message is said on one line
        "policy rule 'long-runs-labelled': runs over 72 h need APPROVED in their env"
    )


def test_a_retry_or_replay_is_judged_for_whoever_asks_it_now(
    svc: CoreControlService, settings: Settings, tmp_path: Path
) -> None:
    svc.apply_policy(
        "rules:\n  - name: not-bob\n    deny: 'user.name == \"bob\"'\n    message: not bob\n",
        "site.yaml",
    )
    run = svc.wait_for(svc.submit_task(submission(), base_dir=tmp_path).id, timeout_s=60)
    assert run.policy.role == "admin"  # type: ignore[union-attr]  # (embedded: the local user)
    bob = CoreControlService.from_settings(settings, actor="bob")
    try:
        with pytest.raises(Refused, match=r"^policy rule 'not-bob': not bob \(policy version 1"):
            bob.replay_run(run.id)
    finally:
        bob.close()


def test_a_version_exports_as_one_document_with_its_check_and_what_it_changed(
    svc: CoreControlService,
) -> None:
    svc.apply_policy(LOOSE, "site.yaml")
    for _ in range(2):
        recorded(svc, "ann", "batch", 4)
    recorded(svc, "bob", "batch", 1)
    svc.apply_policy(POLICY, "site.yaml")
    review = svc.review_policy(2, timedelta(days=1))
    assert review.version.version == 2 and review.version.body == POLICY
    assert review.check.passed and review.check.sha256 == review.version.sha256
    assert review.diff.current_version == 1 and review.diff.submissions == 3
    assert (review.diff.newly_denied, review.window_end) == (2, review.version.applied_at)
    recorded(svc, "bob", "batch", 8)  # after it was applied: not what it was judged on
    assert svc.review_policy(2, timedelta(days=1)).diff.submissions == 3
    first = svc.review_policy(1, timedelta(days=1))
    assert first.diff.current_version is None and first.diff.submissions == 0

"""A run's secrets, through the control service on SQLite and PostgreSQL with real detached
runs on this machine: named in the spec (the bundle holds the references, never a value, so a
changed value freezes to the same bundle), refused at submit in one line when a reference does
not resolve for the submitter, shown by a dry run with their scope, resolved again at every
launch (a retry takes the value set since; a secret removed fails the launch, not the task),
given to the task as environment, and masked in every file ORBIT writes of the run."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.errors import InvalidInput, Refused
from orbit.model.models import FailureReason, RunState
from orbit.model.secrets import Scope
from orbit.model.spec import spec_of, to_submission

VALUE = "hf_RunSecret_0123456789abcdefXYZ"
NEW = "hf_Rotated_9876543210fedcbaQRS"
# the task prints its secret plainly, in base64, URL-encoded, split across two writes with a
# pause between them (two reads of the pipe), and the sha256 that tells which value it had
TASK = (
    'echo "token=$HF_TOKEN"; printf %s "$HF_TOKEN" | base64; '
    'python3 -c \'import os,urllib.parse as u; print("url=" + u.quote(os.environ["HF_TOKEN"]))\''
    "; "
    'printf "split=%s" "${HF_TOKEN:0:9}"; sleep 0.3; echo "${HF_TOKEN:9}"; '
    'printf %s "$HF_TOKEN" | sha256sum; echo "$HF_TOKEN" >&2'
)


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def forms(value: str) -> list[bytes]:
    raw = value.encode()
    return [raw, base64.b64encode(raw), urllib.parse.quote(value, safe="").encode()]


@pytest.fixture
def svc(settings: Settings, tmp_path: Path) -> Any:
    templates = tmp_path / "execution_templates"  # the cwd's (tests/conftest.py: orbit_home)
    templates.mkdir()
    (templates / "strict.yaml").write_text(  # a secret of its own, none from a spec
        "id: strict\nplacement: {kind: local}\nlaunch_mode: {kind: host_process}\n"
        "defaults: {secrets: {WANDB_API_KEY: hf}}\n"
    )
    service = CoreControlService.from_settings(settings, actor="mia")
    yield service
    service.close()


def submit(svc: CoreControlService, tmp_path: Path, *, dry: bool = False, **spec: Any) -> Any:
    data = {
        "experiment": "llm",
        "task_type": "command",
        "template": "local",
        "task": {"command": TASK},
        "secrets": {"HF_TOKEN": "hf"},
        **spec,
    }
    submission = to_submission(spec_of(data, "spec.yaml"), "spec.yaml")
    if dry:
        return svc.plan_submission(submission, base_dir=tmp_path)
    return svc.submit_task(submission, base_dir=tmp_path)


def files_under(path: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in path.rglob("*") if p.is_file() and not p.is_symlink()}


def test_the_task_gets_its_secret_and_every_file_orbit_writes_holds_it_masked(
    svc: CoreControlService, settings: Settings, tmp_path: Path
) -> None:
    svc.set_secret("hf", VALUE.encode())
    run = svc.wait_for(submit(svc, tmp_path).id, timeout_s=60)
    assert run.state is RunState.SUCCEEDED, run.current.message
    folder = Path(run.current.handle.location)  # type: ignore[union-attr]
    log = (folder / "artifacts" / "training.log").read_text()
    assert "token=***" in log and "split=***\n" in log and "url=***" in log
    assert sha(VALUE) in log  # the task had the value itself
    assert log.count("***") == 5, log  # the stderr line too
    # no form of the value in any file of the run, nor in the bundle, nor anywhere in the home
    for path, data in files_under(settings.home).items():
        assert not any(form in data for form in forms(VALUE)), path
    manifest = json.loads((folder / "artifacts" / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["path"] == "training.log")
    assert entry["sha256"] == hashlib.sha256(log.encode()).hexdigest()  # of what all see
    bundle_job = json.loads((settings.bundles_dir / run.bundle_digest / "job.json").read_text())
    assert bundle_job["secrets"] == {"HF_TOKEN": "hf"} and "HF_TOKEN" not in bundle_job["env"]
    # a new value freezes to the same bundle: it holds the reference alone
    svc.set_secret("hf", NEW.encode())
    assert submit(svc, tmp_path, dry=True).bundle_digest == run.bundle_digest
    used = [e for e in svc.store.audit.list_events(run_id=run.id) if e.action == "secret.used"]
    assert [(e.attempt_id, e.data["secrets"]) for e in used] == [(run.current.id, ["user:hf"])]
    (listed,) = svc.list_secrets()
    assert listed.used_at is not None


def test_a_reference_that_does_not_resolve_is_refused_at_submit_naming_field_and_secret(
    svc: CoreControlService, settings: Settings, tmp_path: Path
) -> None:
    other = CoreControlService.from_settings(settings, actor="bob")
    try:
        other.set_secret("bobs", VALUE.encode())  # another user's: not mia's to use
    finally:
        other.close()
    for name in ("nope", "bobs"):
        with pytest.raises(InvalidInput) as caught:
            submit(svc, tmp_path, secrets={"HF_TOKEN": name})
        line = str(caught.value)
        assert line.startswith(f"secrets.HF_TOKEN: no secret '{name}' for mia") and "\n" not in line
        assert f"orbit secrets set {name}" in line
    svc.set_secret("hf", VALUE.encode())
    with pytest.raises(InvalidInput, match=r"^secrets\.HUB_ID: the run's env sets HUB_ID too"):
        submit(
            svc, tmp_path, task={"command": "true", "env": {"HUB_ID": "x"}},
            secrets={"HUB_ID": "hf"},
        )  # fmt: skip
    with pytest.raises(InvalidInput, match=r"^secrets\.ORBIT_RUN_ID: ORBIT_\* variables"):
        submit(svc, tmp_path, secrets={"ORBIT_RUN_ID": "hf"})
    with pytest.raises(InvalidInput, match=r"spec\.yaml: secrets"):
        submit(svc, tmp_path, secrets={"BAD-NAME": "hf"})
    with pytest.raises(Refused, match=r"^override 'secrets\.HF_TOKEN' is not allowed by template"):
        submit(svc, tmp_path, template="strict")
    assert svc.list_runs() == []  # nothing written
    # a template's own default is used (and needs no override)
    plan = submit(svc, tmp_path, dry=True, template="strict", secrets=None)
    assert [(u.env, u.name) for u in plan.secrets] == [("WANDB_API_KEY", "hf")]


def test_a_dry_run_shows_which_secret_would_be_used_and_whose_the_users_own_first(
    svc: CoreControlService, settings: Settings, tmp_path: Path
) -> None:
    admin = CoreControlService.from_settings(settings, actor="root")
    try:
        admin.set_secret("wandb", b"shared-wandb-key", Scope.GLOBAL)
        admin.set_secret("hf", b"shared-hf-token", Scope.GLOBAL)
    finally:
        admin.close()
    svc.set_secret("hf", VALUE.encode())
    plan = submit(svc, tmp_path, dry=True, secrets={"HF_TOKEN": "hf", "WANDB_API_KEY": "wandb"})
    assert [(u.env, u.name, u.scope, u.owner) for u in plan.secrets] == [
        ("HF_TOKEN", "hf", Scope.USER, "mia"),
        ("WANDB_API_KEY", "wandb", Scope.GLOBAL, ""),
    ]
    assert VALUE not in plan.model_dump_json() and "shared-" not in plan.model_dump_json()
    assert plan.job["secrets"] == {"HF_TOKEN": "hf", "WANDB_API_KEY": "wandb"}


def test_a_retry_resolves_again_a_new_value_is_used_and_a_removed_one_fails_the_launch(
    svc: CoreControlService, tmp_path: Path
) -> None:
    svc.set_secret("hf", VALUE.encode())
    # (a launch_failed is retried by the policy as an infrastructure failure: not here)
    run = svc.wait_for(submit(svc, tmp_path, retry={"max_retries": 0}).id, timeout_s=60)
    assert run.state is RunState.SUCCEEDED
    svc.set_secret("hf", NEW.encode())
    again = svc.wait_for(svc.retry_run(run.id).id, timeout_s=60)
    assert again.state is RunState.SUCCEEDED and len(again.attempts) == 2
    log = (Path(again.current.handle.location) / "artifacts" / "training.log").read_text()  # type: ignore[union-attr]
    assert sha(NEW) in log and sha(VALUE) not in log and NEW not in log
    svc.remove_secret("hf")
    gone = svc.wait_for(svc.retry_run(run.id).id, timeout_s=60)
    last = gone.current
    assert last.state is RunState.FAILED and last.reason is FailureReason.LAUNCH_FAILED
    assert last.message is not None
    assert last.message.startswith("secrets.HF_TOKEN: no secret 'hf' for mia"), last.message
    replayed = svc.wait_for(svc.replay_run(run.id).id, timeout_s=60)
    assert replayed.current.reason is FailureReason.LAUNCH_FAILED


def test_a_claim_without_secrets_reads_as_before_them_and_a_rank_log_is_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import shutil

    from orbit.runtime import torchrun_launch
    from orbit.wire import protocol as p

    # an agent of the protocol before secrets reads a claim's answer without them
    assert json.loads(p.ClaimResponse(granted=True).model_dump_json()) == {
        "granted": True,
        "why": "",
    }
    assert VALUE not in repr(p.ClaimResponse(granted=True, secrets={"HF_TOKEN": VALUE}))
    # torchrun's launcher keeps each rank's output apart: masked there too
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(Path(torchrun_launch.__file__).with_name("redact.py"), scripts / "orbit_redact.py")
    monkeypatch.setenv("ORBIT_BUNDLE_DIR", str(tmp_path))
    monkeypatch.setenv("ORBIT_SECRET_NAMES", "HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", VALUE)
    read, write = os.pipe()
    os.write(write, f"loading with {VALUE[:7]}".encode())
    os.write(write, f"{VALUE[7:]} done\n".encode())
    os.close(write)
    log = tmp_path / "0.log"
    with log.open("ab") as f:  # (its lines go to stdout too: training.log, masked by the wrapper)
        torchrun_launch.pump(read, f, b"[rank0]: ", torchrun_launch.masker())
    os.close(read)
    assert log.read_text() == "loading with *** done\n"

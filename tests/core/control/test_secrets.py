"""Secrets in the control service, on SQLite and PostgreSQL: values sealed under the key set
before the store sees them (no value, nor its base64, anywhere in the database), listed and
audited without values, resolved for a run (the submitter's own first), re-sealed under a new
key while a second replica goes on opening them, and a store without its key set yields
nothing and is refused in one line."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.errors import InvalidInput, NotFound, StoreError
from orbit.model.secrets import Scope
from tests.store.raw import query

HF = b"hf_SuperSecretValue_0123456789"


def make(settings: Settings, home: Path | None = None, actor: str = "mia") -> CoreControlService:
    if home is not None:
        settings = Settings(home=home, database_url=settings.database_url)
    return CoreControlService.from_settings(settings, actor=actor)


def everything_in(svc: CoreControlService) -> str:
    """Every row of every table the secrets touch, as text: what a dump of the store holds."""
    rows: list[Any] = []
    for table in ("secrets", "events"):
        rows += query(svc.store, f"SELECT * FROM {table}")
    return json.dumps(rows, default=str)


@pytest.fixture
def svc(settings: Settings) -> Any:
    service = make(settings)
    service.store.experiments.create_experiment("llama", "admin")
    yield service
    service.close()


def test_values_are_sealed_listed_without_values_and_audited_by_name(svc: Any) -> None:
    record = svc.set_secret("hf_token", HF)
    assert record.rotated_at is None and record.scope == Scope.USER and record.owner == "mia"
    again = svc.set_secret("hf_token", HF + b"-2")
    assert again.rotated_at is not None and again.created_at == record.created_at
    svc.set_secret("wandb", b"w" * 40, Scope.GLOBAL)
    listed = svc.list_secrets()
    assert [(s.name, s.scope.value) for s in listed] == [("wandb", "global"), ("hf_token", "user")]
    assert "SuperSecret" not in json.dumps([s.model_dump(mode="json") for s in listed])
    dump = everything_in(svc)
    for value in (HF, HF + b"-2"):
        assert value.decode() not in dump and base64.b64encode(value).decode() not in dump
    actions = [e.action for e in svc.store.audit.list_events() if e.action.startswith("secret.")]
    assert actions == ["secret.set", "secret.replaced", "secret.set"]
    svc.remove_secret("hf_token")
    with pytest.raises(NotFound, match="no user secret 'hf_token' of mia"):
        svc.remove_secret("hf_token")


@pytest.mark.parametrize(
    ("name", "value", "scope", "experiment", "says"),
    [
        ("hf_token", b"", Scope.USER, None, "value: empty"),
        ("hf_token", b"x" * (64 * 1024 + 1), Scope.USER, None, "value: 65,537 bytes, over"),
        ("hf_token", b"a\0b", Scope.USER, None, "value: holds a NUL byte"),
        ("hf-token", b"x", Scope.USER, None, "name: 'hf-token' is not a secret name"),
        ("9lives", b"x", Scope.USER, None, "name: '9lives' is not a secret name"),
        ("hf_token", b"x", Scope.EXPERIMENT, None, "--experiment: an experiment's secret needs"),
        ("hf_token", b"x", Scope.GLOBAL, "llama", "--experiment: a global secret is for every"),
        ("hf_token", b"x", Scope.EXPERIMENT, "nope", "nope"),
    ],
)
def test_bad_input_is_refused_in_one_line_and_nothing_is_stored(
    svc: Any, name: str, value: bytes, scope: Scope, experiment: str | None, says: str
) -> None:
    with pytest.raises((InvalidInput, NotFound)) as caught:
        svc.set_secret(name, value, scope, experiment)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert svc.list_secrets() == []


def test_a_reference_resolves_to_the_submitters_own_first(settings: Settings, svc: Any) -> None:
    exp = svc.store.experiments.get_experiment("llama").id
    svc.set_secret("hf_token", b"global-value", Scope.GLOBAL)
    svc.set_secret("hf_token", b"experiment-value", Scope.EXPERIMENT, "llama")
    refs = {"HF_TOKEN": "hf_token"}
    assert svc.open_secrets(svc.resolve_secrets(refs, "mia", exp)) == {
        "HF_TOKEN": "experiment-value"
    }
    svc.set_secret("hf_token", b"mias-own")
    assert svc.open_secrets(svc.resolve_secrets(refs, "mia", exp)) == {"HF_TOKEN": "mias-own"}
    # ben's run sees the shared one, never mia's own
    assert svc.open_secrets(svc.resolve_secrets(refs, "ben", exp)) == {
        "HF_TOKEN": "experiment-value"
    }
    with pytest.raises(InvalidInput, match=r"^secrets.WANDB_API_KEY: no secret 'wandb' for ben"):
        svc.resolve_secrets({"WANDB_API_KEY": "wandb"}, "ben", exp)


def test_rotation_reseals_every_value_and_a_second_replica_follows(
    settings: Settings, svc: Any
) -> None:
    exp = svc.store.experiments.get_experiment("llama").id
    replica = make(settings, actor="ben")  # the same home: the same key file
    try:
        svc.set_secret("hf_token", HF)
        replica.set_secret("wandb", b"ben-wandb")
        before = svc.list_secrets()
        first = {s.key_id for s in before}
        assert len(first) == 1
        rotation = svc.rotate_secret_key()
        assert rotation.resealed == 2 and rotation.retired == sorted(first)
        assert {s.key_id for s in svc.list_secrets()} == {rotation.key_id}
        keys = json.loads(settings.secret_keys_file.read_text())
        assert list(keys["keys"]) == [rotation.key_id] == [keys["current"]]
        assert settings.secret_keys_file.stat().st_mode & 0o777 == 0o600
        # the replica never restarted: it reads the new key set at its next use
        opened = replica.open_secrets(replica.resolve_secrets({"T": "hf_token"}, "mia", exp))
        assert opened == {"T": HF.decode()}
        replica.set_secret("after", b"sealed-under-the-new-key")
        assert {s.key_id for s in svc.list_secrets()} == {rotation.key_id}
        events = [e for e in svc.store.audit.list_events() if e.action == "secret.key_rotated"]
        assert events[0].data["resealed"] == 2 and HF.decode() not in json.dumps(events[0].data)
    finally:
        replica.close()


def test_a_store_without_its_key_set_yields_nothing_and_is_refused(
    settings: Settings, svc: Any, tmp_path: Path
) -> None:
    exp = svc.store.experiments.get_experiment("llama").id
    svc.set_secret("hf_token", HF)
    kid = svc.list_secrets()[0].key_id
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(settings.audit_key_file, elsewhere / "audit-key")  # the store's, not secrets'
    stranger = make(settings, home=elsewhere)  # the same store, a new key set
    try:
        with pytest.raises(StoreError, match=f"sealed under key\\(s\\) {kid}, which .* does not"):
            stranger.check_secret_keys()
        with pytest.raises(InvalidInput, match=f"secret key {kid} is not in this server's key"):
            stranger.open_secrets(stranger.resolve_secrets({"T": "hf_token"}, "mia", exp))
        # with the key file copied along, it opens
        shutil.copy(settings.secret_keys_file, elsewhere / "secret-keys")
        stranger.check_secret_keys()
        opened = stranger.open_secrets(stranger.resolve_secrets({"T": "hf_token"}, "mia", exp))
        assert opened == {"T": HF.decode()}
    finally:
        stranger.close()


def test_a_value_moved_onto_another_secrets_row_does_not_open(svc: Any) -> None:
    exp = svc.store.experiments.get_experiment("llama").id
    svc.set_secret("hf_token", HF)
    svc.set_secret("other", b"harmless")
    with svc.store.db.transaction(write=True) as tx:  # someone who can write the database
        sealed = tx.scalar("SELECT sealed FROM secrets WHERE name = 'hf_token'")
        tx.execute("UPDATE secrets SET sealed = :s WHERE name = 'other'", {"s": sealed})
    with pytest.raises(InvalidInput, match="does not open: altered"):
        svc.open_secrets(svc.resolve_secrets({"T": "other"}, "mia", exp))


def test_keys_given_in_the_environment_seal_and_are_rotated_where_they_are_kept(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orbit.model.secret_keys import new_key_set

    keys = new_key_set()
    monkeypatch.setenv("ORBIT_SECRET_KEYS", keys.to_json())
    service = make(settings)
    try:
        assert service.set_secret("hf_token", HF).key_id == keys.current
        assert not settings.secret_keys_file.exists()  # nothing written beside the store
        with pytest.raises(InvalidInput, match="the secret keys come from ORBIT_SECRET_KEYS"):
            service.rotate_secret_key()
        monkeypatch.setenv("ORBIT_SECRET_KEYS", '{"current": "k1", "keys": {"k1": "00"}}')
        with pytest.raises(InvalidInput, match="ORBIT_SECRET_KEYS: key k1 is not the key"):
            make(settings).check_secret_keys()
    finally:
        service.close()

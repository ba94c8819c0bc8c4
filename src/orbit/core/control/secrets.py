"""Secrets: set (sealed under the key set before the store sees them), listed without values,
removed, resolved for a run's references, and the key set rotated without a stop.

The key set (orbit.model.secret_keys) is read from ORBIT_SECRET_KEYS, or its file, which is
made on first use and read again whenever it changes on disk: a rotation made by one replica of
`orbit server` is picked up by the others at their next use of a secret. Who may set a shared
secret is the server's to check (an admin); these only do it, for the caller, and audit it."""

from __future__ import annotations

from datetime import UTC, datetime

from orbit.core.control.base import ServicePart
from orbit.core.control.keyring import Keyring
from orbit.core.control.views import SecretUse
from orbit.model.errors import InvalidInput, StoreError
from orbit.model.records import RunRecord
from orbit.model.secret_keys import retired, with_new_key
from orbit.model.secrets import (
    KeyRotation,
    Scope,
    SecretRecord,
    bound_to,
    check_name,
    check_value,
)
from orbit.store.secrets import Sealed


class SecretsPart(ServicePart):
    @property
    def keyring(self) -> Keyring:
        return self.shared.keyring

    def set_secret(
        self, name: str, value: bytes, scope: Scope = Scope.USER, experiment: str | None = None
    ) -> SecretRecord:
        """Seal `value` and keep it as the caller's own secret `name` (or the experiment's, or
        everyone's); a value it replaced shows as its `rotated_at`."""
        check_name(name)
        check_value(value)
        owner = self._owner(scope, experiment)
        key_id, sealed = self.keyring.keys().seal(value, bound_to(scope, owner, name))
        return self.store.secrets.put(scope, owner, name, key_id, sealed, self.actor)

    def list_secrets(self, scope: Scope | None = None) -> list[SecretRecord]:
        return self.store.secrets.list_secrets(scope=scope)

    def remove_secret(
        self, name: str, scope: Scope = Scope.USER, experiment: str | None = None
    ) -> SecretRecord:
        check_name(name)
        return self.store.secrets.remove(scope, self._owner(scope, experiment), name, self.actor)

    def resolve_secrets(
        self, refs: dict[str, str], user: str, experiment_id: str, field: str = "secrets"
    ) -> dict[str, Sealed]:
        """Each env name's secret, as `user` would have it in the experiment; a reference that
        does not resolve is refused in one line naming the field and the secret."""
        for env, name in refs.items():
            check_name(env, f"{field}: the environment variable")
            check_name(name, f"{field}.{env}")
        found = self.store.secrets.resolve(user, experiment_id, set(refs.values()))
        for env, name in sorted(refs.items()):
            if name not in found:
                raise InvalidInput(
                    f"{field}.{env}: no secret '{name}' for {user} (their own, the "
                    "experiment's or a global one); set it with `orbit secrets set "
                    f"{name}`"
                )
        return {env: found[name] for env, name in refs.items()}

    def uses(
        self, refs: dict[str, str], user: str, experiment_id: str, field: str = "secrets"
    ) -> list[SecretUse]:
        """Which secret each reference would use for `user`, and whose it is: what a submit
        checks and `submit --dry-run` shows."""
        resolved = self.resolve_secrets(refs, user, experiment_id, field)
        return [
            SecretUse(env=env, name=s.name, scope=s.scope, owner=s.owner)
            for env, s in sorted(resolved.items())
        ]

    def deliver(self, run: RunRecord, attempt_id: str) -> dict[str, str]:
        """The values of a run's secrets for one of its attempts, resolved again now for its
        submitter (a value set or rotated since is the one used); each use is recorded (the
        secret's used_at, and an audit event naming the secrets, never their values). A
        reference that no longer resolves, or a value the key set cannot open, is refused in
        one line: the launch fails with it."""
        refs = run.request.secrets
        if not refs:
            return {}
        resolved = self.resolve_secrets(refs, run.created_by, run.experiment_id)
        try:
            values = self.open_secrets(resolved)
        except InvalidInput as exc:  # a key the set lacks, a value altered: never the value
            raise InvalidInput(f"secrets: {exc} ({self.keyring.source})") from None
        self.store.secrets.mark_used(
            list({s.id: s for s in resolved.values()}.values()),
            run_id=run.id,
            attempt_id=attempt_id,
            actor="orbit",
            at=datetime.now(UTC),
        )
        return values

    def open_secrets(self, resolved: dict[str, Sealed]) -> dict[str, str]:
        """The values of resolved secrets, as the environment a run gets."""
        keys = self.keyring.keys()
        return {
            env: keys.open(s.key_id, s.sealed, bound_to(s.scope, s.owner, s.name)).decode()
            for env, s in resolved.items()
        }

    def rotate_secret_key(self) -> KeyRotation:
        """A new key in the set; every value re-sealed under it; the keys no value is sealed
        under any more retired. The server goes on: values are opened under whichever key
        they name until then."""
        keys = with_new_key(self.keyring.keys())
        self.keyring.save(keys)
        resealed = 0
        for found in self.store.secrets.sealed_under_other_keys(keys.current):
            place = bound_to(found.scope, found.owner, found.name)
            value = keys.open(found.key_id, found.sealed, place)
            _, sealed = keys.seal(value, place)
            resealed += self.store.secrets.reseal(found, keys.current, sealed)
        left = self.store.secrets.key_ids() - {keys.current}
        gone = set(keys.keys) - {keys.current} - left
        self.keyring.save(retired(keys, gone))
        self.store.secrets.record_rotation(keys.current, resealed, sorted(gone), self.actor)
        return KeyRotation(key_id=keys.current, resealed=resealed, retired=sorted(gone))

    def check_secret_keys(self) -> None:
        """Refuse (one line) when the store holds values sealed under keys the key set lacks:
        a server must not start and then fail every run that uses them."""
        keys = self.keyring.keys()
        missing = sorted(self.store.secrets.key_ids() - set(keys.keys))
        if missing:
            raise StoreError(
                f"the store's secrets are sealed under key(s) {', '.join(missing)}, which "
                f"{self.keyring.source} does not hold: give this server the key set it was "
                "made with"
            )

    def _owner(self, scope: Scope, experiment: str | None) -> str:
        if scope is Scope.USER:
            if experiment:
                raise InvalidInput("--experiment: only an experiment's secret names one")
            return self.actor
        if scope is Scope.EXPERIMENT:
            if not experiment:
                raise InvalidInput("--experiment: an experiment's secret needs its name")
            return self.store.experiments.get_experiment(experiment).id
        if experiment:
            raise InvalidInput("--experiment: a global secret is for every experiment")
        return ""

"""Idempotency keys: a request that makes a run (a submit, a replay) may carry one, and the same
user sending the same request with the same key again gets the run the first one made instead
of a second run. Clients send a fresh key per submission and send it again only when they lost
the answer (orbit.client.session); the store keeps each key for a day (orbit.store.submit_keys).

A key comes with the fingerprint of its request: the same key with a different request is not
a retry but a mistake, refused naming the key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orbit.model.errors import Refused

if TYPE_CHECKING:
    from orbit.model.models import ExecutionOverrides
    from orbit.model.records import RunRecord
    from orbit.store import Store
    from orbit.store.submit_keys import SubmitKey

HEADER = "Idempotency-Key"
# a uuid in any of its spellings, or another token of the client's choosing
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


@dataclass(frozen=True)
class Idempotency:
    """An idempotency key as a request sent it, and the fingerprint of that request."""

    key: str
    fingerprint: str

    def of(self, user: str) -> SubmitKey:
        from orbit.store.submit_keys import SubmitKey

        return SubmitKey(user=user, value=self.key, fingerprint=self.fingerprint)


def for_submit(
    key: str | None, submission: str, shaped: str, source: str, inputs: str
) -> Idempotency | None:
    """A submit's key, with the fingerprint of its form's fields and its inputs' digest (a
    client's retry sends the very same, with or without the archive)."""
    if key is None:
        return None
    return Idempotency(key, fingerprint("submit", submission, shaped, source, inputs))


def for_sweep(
    key: str | None, submission: str, shaped: str, sweep: str, source: str, inputs: str
) -> Idempotency | None:
    """A sweep's key (see for_submit): its first run stands for the group it made."""
    if key is None:
        return None
    return Idempotency(key, fingerprint("sweep", submission, shaped, sweep, source, inputs))


def for_replay(
    key: str | None, ref: str, overrides: ExecutionOverrides | None
) -> Idempotency | None:
    """A replay's key, with the fingerprint of the run it replays and its overrides."""
    if key is None:
        return None
    said = overrides.model_dump_json(exclude_unset=True) if overrides else ""
    return Idempotency(key, fingerprint("replay", ref, said))


def fingerprint(*parts: str | bytes) -> str:
    """sha256 over the parts, each framed by its length (no two lists of parts read alike)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def made_by(store: Store, key: SubmitKey | None) -> RunRecord | None:
    """The run `key` made already, if any: the answer to a retry. Refused when that run was
    made by a different request."""
    if key is None:
        return None
    found = store.submit_keys.find_submit_key(key.user, key.value)
    if found is None:
        return None
    if found.fingerprint != key.fingerprint:
        raise Refused(
            f"{HEADER} {key.value}: already used for a different request (it made run "
            f"{found.run_id}); send a new key with a new submission"
        )
    return store.runs.get_run(found.run_id)


def made_meanwhile(store: Store, key: SubmitKey) -> RunRecord:
    """The run another request with `key` made while this one was at work (see KeyTaken)."""
    run = made_by(store, key)
    if run is None:  # written and gone again within one request: only if KEEP passed
        raise Refused(f"{HEADER} {key.value}: expired while in use; send a new key")
    return run

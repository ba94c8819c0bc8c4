"""The keys that seal secrets' values in the store, and the sealing.

A key set is a file outside the database (by default $ORBIT_HOME/secret-keys, or
ORBIT_SECRET_KEYS_FILE), readable by its owner only and made on first use, or the same JSON in
the ORBIT_SECRET_KEYS variable for deployments that keep keys elsewhere:

    {"current": "KEY_ID", "keys": {"KEY_ID": "64 hex digits", ...}}

A key's id is derived from the key (an HMAC of a fixed label), so a file holding other keys
under the same names is found out, and a store whose values were sealed under a key the set
lacks names that key's id. Values are sealed with AES-256-GCM (the `cryptography` library),
bound to the secret they belong to (its scope, owner and name as associated data): a value
copied onto another secret's row does not open. A store copied without its key set yields no
value."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from orbit.model.errors import InvalidInput

KEY_BYTES = 32
NONCE_BYTES = 12


def key_id(key: bytes) -> str:
    return "k" + hmac.new(key, b"orbit-secret-key-id", hashlib.sha256).hexdigest()[:15]


@dataclass(frozen=True)
class KeySet:
    """The keys by id, and which one seals new values."""

    current: str
    keys: dict[str, bytes] = field(default_factory=dict)

    def seal(self, value: bytes, bound_to: str) -> tuple[str, str]:
        """(the current key's id, the sealed value as text) of `value`, bound to `bound_to`."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # where a value is sealed

        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = AESGCM(self.keys[self.current]).encrypt(nonce, value, bound_to.encode())
        return self.current, base64.b64encode(nonce + sealed).decode("ascii")

    def open(self, kid: str, sealed: str, bound_to: str) -> bytes:
        """The value sealed under key `kid` for `bound_to`; InvalidInput when this set lacks
        that key or the value does not open (altered, or sealed for another secret)."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self.keys.get(kid)
        if key is None:
            raise InvalidInput(f"secret key {kid} is not in this server's key set")
        raw = base64.b64decode(sealed)
        try:
            return AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], bound_to.encode())
        except InvalidTag:
            raise InvalidInput(f"a value sealed under key {kid} does not open: altered?") from None

    def to_json(self) -> str:
        keys = {kid: key.hex() for kid, key in self.keys.items()}
        return json.dumps({"current": self.current, "keys": keys}, indent=1) + "\n"


def new_key_set() -> KeySet:
    key = secrets.token_bytes(KEY_BYTES)
    return KeySet(current=key_id(key), keys={key_id(key): key})


def parse_key_set(text: str, where: str) -> KeySet:
    """The key set in `text` (the file's or the variable's JSON); `where` names it in errors."""
    try:
        data = json.loads(text)
        current = data["current"]
        keys = {kid: bytes.fromhex(hexed) for kid, hexed in data["keys"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidInput(
            f'{where}: expected {{"current": KEY_ID, "keys": {{KEY_ID: 64 hex digits}}}}'
        ) from None
    for kid, key in keys.items():
        if len(key) != KEY_BYTES or key_id(key) != kid:
            raise InvalidInput(f"{where}: key {kid} is not the key of that id")
    if current not in keys:
        raise InvalidInput(f"{where}: the current key {current} is not among its keys")
    return KeySet(current=current, keys=keys)


def load_key_set(path: Path) -> KeySet:
    """The key set in `path`, made there first (mode 0600) when there is none. Processes that
    start together agree: the file appears whole, in one link, and the loser reads it."""
    try:
        return parse_key_set(path.read_text(encoding="ascii"), str(path))
    except FileNotFoundError:
        pass
    _write_new(path, new_key_set(), replace=False)
    return parse_key_set(path.read_text(encoding="ascii"), str(path))


def save_key_set(path: Path, keys: KeySet) -> None:
    """Replace the file at `path` with `keys`, whole, in one rename (mode 0600)."""
    _write_new(path, keys, replace=True)


def _write_new(path: Path, keys: KeySet, *, replace: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(keys.to_json())
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):  # never replace a set made meanwhile
                os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def with_new_key(keys: KeySet) -> KeySet:
    """`keys` and a new key, which seals from now on."""
    key = secrets.token_bytes(KEY_BYTES)
    return KeySet(current=key_id(key), keys={**keys.keys, key_id(key): key})


def retired(keys: KeySet, kids: set[str]) -> KeySet:
    """`keys` without `kids` (never the current one)."""
    kept = {kid: key for kid, key in keys.keys.items() if kid not in kids or kid == keys.current}
    return KeySet(current=keys.current, keys=kept)

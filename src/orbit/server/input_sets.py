"""Inputs a user sent before, named by their digest (orbit.core.execution.bundle.inputs_digest):
a client sends the digest of what it gathered first; where the server holds those inputs *for
that user*, it makes the bundle from them and nothing is uploaded; where it does not, it answers
InputsWanted (409) and the client sends the archive, whose unpacked files must give the digest
it named (else it is refused, and nothing is kept).

What the server holds is an index per user, written only from bytes that user sent and the
server hashed itself: digest -> the newest bundle whose inputs/ are those files, each file's hash
and the inode it was hashed at. A hit links that bundle's files (never copies or reads them: a
file whose inode, size or mtime changed is hashed again, and a tree that no longer gives the
digest is a miss). Another user's digest is a miss like one never sent: nobody reaches bytes
they did not send. An entry whose bundle is gone (gc, runs deleted) is a miss and is removed."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from orbit.core.control.copies import Places
from orbit.core.execution.bundle import Memo, inputs_digest
from orbit.core.execution.bundle_link import link_tree
from orbit.model.errors import InputsWanted, InvalidInput
from orbit.server.config import Limits
from orbit.server.uploads import unpack_inputs, within_limits

DIGEST = re.compile(r"^[0-9a-f]{64}\Z")
log = logging.getLogger("orbit.server")


@dataclass
class Received:
    """A submission's inputs here: where they are, their digest, their files' hashes by inode,
    and the bundle they were linked from (None: they came as an upload)."""

    folder: Path
    digest: str
    memo: Memo = field(default_factory=dict)
    held_in: str | None = None
    sent_bytes: int = 0

    @property
    def reused(self) -> bool:
        return self.held_in is not None


class InputSets:
    def __init__(self, bundles: Path, limits: Limits) -> None:
        self.bundles = bundles
        self.limits = limits

    @contextmanager
    def receive(
        self, user_id: str, claimed: str | None, upload: IO[bytes] | None
    ) -> Iterator[Received]:
        """The inputs of one submission, in a scratch folder beside the bundles (so that
        freezing links them), removed afterwards. `claimed`: the digest the client named;
        `upload`: the archive it sent, if it sent one."""
        if claimed is not None and not DIGEST.match(claimed):
            raise InvalidInput("inputs_digest: expected 64 lowercase hex digits (a sha256)")
        self.bundles.mkdir(parents=True, exist_ok=True)
        if upload is None:
            if claimed is None:
                raise InvalidInput(
                    "inputs: required (the archive, or inputs_digest for inputs sent before)"
                )
            with self._held(user_id, claimed) as held:
                if held is None:
                    raise InputsWanted(
                        f"inputs_digest: {claimed[:12]}: not held for you here; send the inputs"
                    )
                yield held
            return
        with unpack_inputs(upload, self.limits, self.bundles) as folder:
            memo: Memo = {}
            digest, _ = inputs_digest(folder, memo)
            if claimed is not None and claimed != digest:
                raise InvalidInput(
                    f"inputs_digest: {claimed[:12]} does not match the inputs sent "
                    f"({digest[:12]}); nothing was kept"
                )
            yield Received(folder, digest, memo, sent_bytes=_size(upload))

    @contextmanager
    def _held(self, user_id: str, digest: str) -> Iterator[Received | None]:
        entry = self._entry(user_id, digest)
        found = _read(entry)
        source = self.bundles / found[0] / "inputs" if found is not None else None
        if found is None or source is None or not source.is_dir():
            entry.unlink(missing_ok=True)
            yield None
            return
        files = found[1].values()  # within the limits as they would be, sent again today
        size = sum(k[3] for k in files if len(k) == 5 and isinstance(k[3], int))
        within_limits(len(files), size, self.limits)
        scratch = Path(tempfile.mkdtemp(prefix=".inputs-", dir=self.bundles))
        try:
            folder = scratch / "inputs"
            try:
                link_tree(source, folder)
                memo = _memo(folder, found[1])
                again, _ = inputs_digest(folder, memo)
            except OSError:  # the bundle removed meanwhile (gc, runs delete): send them
                again = ""
            if again != digest:  # or changed, or cut short
                entry.unlink(missing_ok=True)
                yield None
                return
            yield Received(folder, digest, memo, held_in=found[0])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def remember(self, user_id: str, received: Received, bundle_digest: str) -> None:
        """After a submission that froze `received` into `bundle_digest`: held for this user
        from now on, in that bundle (the newest: an older one may be deleted first), where
        its inputs/ are exactly what the client sent (a plugin's own file restaged by the
        server differs, and such inputs are not held). Never fails the submission it
        follows: at worst the next one sends its inputs again."""
        if received.held_in == bundle_digest:
            return
        inputs = self.bundles / bundle_digest / "inputs"
        try:
            digest, hashes = inputs_digest(inputs, received.memo)
            if digest != received.digest:
                return
            files = {}
            for rel, sha in hashes.items():
                st = os.stat(inputs.parent / rel)
                files[rel] = [sha, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
            entry = self._entry(user_id, digest)
            entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            text = json.dumps({"bundle": bundle_digest, "files": files}, sort_keys=True)
            tmp = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}.tmp")  # one per request
            try:
                tmp.write_text(text, encoding="utf-8")
                tmp.replace(entry)
            finally:
                tmp.unlink(missing_ok=True)
        except (OSError, InvalidInput) as exc:
            log.warning("inputs %s not held for the next submit: %s", received.digest[:12], exc)

    def _entry(self, user_id: str, digest: str) -> Path:
        who = hashlib.sha256(user_id.encode()).hexdigest()[:32]
        return Places(self.bundles.parent).inputs_index / who / f"{digest}.json"


def _read(entry: Path) -> tuple[str, dict[str, list[object]]] | None:
    """An index entry: its bundle, and {relpath: [sha256, dev, inode, size, mtime_ns]}."""
    try:
        found = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    bundle, files = found.get("bundle"), found.get("files")
    if not (isinstance(bundle, str) and DIGEST.match(bundle) and isinstance(files, dict)):
        return None
    return bundle, files


def _memo(folder: Path, files: dict[str, list[object]]) -> Memo:
    """The recorded hashes of the files still at the inode, size and mtime they had."""
    memo: Memo = {}
    for rel, known in files.items():
        if not (isinstance(known, list) and len(known) == 5 and isinstance(known[0], str)):
            continue
        try:
            st = os.stat(folder.parent / rel)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if list(key) == known[1:]:
            memo[key] = known[0]
    return memo


def _size(upload: IO[bytes]) -> int:
    upload.seek(0, os.SEEK_END)
    size = upload.tell()
    upload.seek(0)
    return size

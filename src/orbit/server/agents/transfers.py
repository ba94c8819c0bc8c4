"""Files between the control plane and agent nodes: a bundle's archive for a node that runs
it, an earlier attempt's file for a resumed start, and the files an admin pushes to a node
or pulls from it (only transfers this server queued for that node)."""

from __future__ import annotations

import base64
import re
import threading
from pathlib import Path
from typing import Any

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.errors import Forbidden, InvalidInput, NotFound
from orbit.model.nodes import NodeRecord
from orbit.server.agents.identity import own
from orbit.wire import protocol as p


class Transfers:
    """Serves and takes the files that travel to and from nodes. Runs in worker threads."""

    def __init__(self, service: CoreControlService, settings: Settings) -> None:
        self.service = service
        self.store = service.store
        self.artifacts = settings.artifacts_dir
        self.archives = settings.home / "bundle-archives"
        self.transfers = settings.home / "transfers"

    def earlier_file(self, node: NodeRecord, attempt_id: str, path: str) -> Path:
        """Refused unless the node runs (or was given) an attempt of the same run, and the
        path is a file under that attempt's artifacts."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", attempt_id):
            raise InvalidInput("attempt_id: expected an attempt id")
        earlier = self.store.runs.get_attempt(attempt_id)
        mine = {self.store.runs.get_attempt(a).run_id for a in node.running}
        if earlier.run_id not in mine:
            raise Forbidden(f"node '{node.name}' runs no attempt of run {earlier.run_id}")
        parts = path.split("/")
        if parts[0] != "artifacts" or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
            raise InvalidInput("path: expected a file under artifacts/")
        found = self.artifacts / attempt_id / path
        if not found.is_file():
            raise NotFound(f"attempt {attempt_id} has no {path} here")
        return found

    def node_bundle(self, node: NodeRecord, digest: str, rebuild: bool = False) -> Path:
        """The bundle's archive, for a node that runs an attempt of it (403 for any other)."""
        if not self.store.placement.node_runs_bundle(node.id, digest):
            raise Forbidden(f"node '{node.name}' runs no attempt of bundle {digest[:12]}")
        return self.bundle_archive(digest, rebuild)

    def bundle_archive(self, digest: str, rebuild: bool = False) -> Path:
        from orbit.core.execution.bundle_archive import create_bundle_archive

        source = self.service.bundles_dir / digest
        if not (source / "job.json").is_file():
            raise NotFound(f"bundle {digest[:12]} is not in this server's cache")
        archive = self.archives / f"{digest}.tar"
        if rebuild or not archive.is_file():
            self.archives.mkdir(parents=True, exist_ok=True)
            scratch = archive.with_name(f".{digest}.{threading.get_ident()}.part")
            create_bundle_archive(source, scratch)
            scratch.replace(archive)
        return archive

    def _open_transfer(self, node: NodeRecord, transfer_id: str, kinds: tuple[str, ...]) -> None:
        """Refuse, before anything is read or written, a transfer id that is not one this
        server queued for this node (of one of `kinds`) and that is still open. The id
        becomes a file name under transfers/NODE/: only ids the server made may."""
        if not re.fullmatch(p.TRANSFER_ID, transfer_id) or not any(
            self.store.commands.transfer_open(node.id, transfer_id, kind) for kind in kinds
        ):
            raise NotFound(f"no pending transfer '{transfer_id[:64]}' for node '{node.name}'")

    def transfer_file(self, node: NodeRecord, transfer_id: str) -> Path:
        self._open_transfer(node, transfer_id, ("put_file",))
        path = self.transfers / node.id / transfer_id
        if not path.is_file():
            raise NotFound(f"no transfer '{transfer_id}' for node '{node.name}'")
        return path

    def transfer_done(self, node: NodeRecord, body: p.TransferDone) -> None:
        own(node, body.node_id)
        self._open_transfer(node, body.transfer_id, ("put_file", "get_file"))
        result: dict[str, Any] = {"error": body.error}
        if body.error is None and body.sha256 is not None:
            import hashlib

            data = base64.b64decode(body.data)
            if hashlib.sha256(data).hexdigest() != body.sha256:
                raise InvalidInput("transfer: the data does not match its sha256")
            folder = self.transfers / node.id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{body.transfer_id}.pulled").write_bytes(data)
            result["sha256"] = body.sha256
            result["size"] = len(data)
        if not self.store.commands.finish_command(body.transfer_id, node.id, result):
            raise NotFound(f"no pending transfer '{body.transfer_id}' for node '{node.name}'")

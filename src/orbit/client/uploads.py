"""A submission's inputs, sent to `orbit server`: the task shaped and its files gathered here,
where they are (the server never reads this machine), packed as one archive and posted with
the submission, its bytes told to a Meter as they go; a submit is sent once in effect, however
often the line drops. Inputs the server holds already for this user are named, not sent (see
orbit.server.input_sets)."""

from __future__ import annotations

import functools
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from orbit.client.meter import QUIET, Meter, MeteredFile
from orbit.client.session import M, Session
from orbit.model.errors import InputsWanted, InvalidInput, NotFound
from orbit.model.models import TaskSubmission

if TYPE_CHECKING:
    import httpx


@functools.cache
def _tasks() -> Any:
    """The task plugins, found once, on the first submit."""
    from orbit.core.tasks import TaskRegistry

    return TaskRegistry()


def upload(
    session: Session,
    model: type[M],
    path: str,
    submission: TaskSubmission,
    base_dir: Path,
    source: str,
    makes_run: bool = False,
    meter: Meter = QUIET,
    gather: TaskSubmission | None = None,
    fields: dict[str, str] | None = None,
) -> M:
    """Shape the task and gather its inputs here, where its files are, and send them
    (once, in effect, when it `makes_run`: see Session.send_once). They are named by their
    digest first: a server that holds them for this user (sent before, unchanged) needs no
    upload; one that does not answers InputsWanted, and the archive goes. `gather`: shape
    this submission to gather them instead (a sweep's first point); `fields`: more form
    fields."""
    from orbit.core.control.submit import gather_inputs
    from orbit.core.execution.bundle import inputs_digest

    key = uuid.uuid4().hex  # one submission, however it is sent
    with tempfile.TemporaryDirectory(prefix="orbit-submit-") as scratch:
        inputs = Path(scratch) / "inputs"
        shaped = gather_inputs(_tasks(), gather or submission, base_dir, source, inputs)
        digest, _ = inputs_digest(inputs)
        form = {
            "submission": submission.model_dump_json(exclude_unset=True),
            "shaped": shaped.model_dump_json(),
            "source": source,
            "inputs_digest": digest,
            **(fields or {}),
        }
        try:
            try:
                response = _send(session, path, form, key, makes_run)
            except (InputsWanted, InvalidInput) as exc:
                if isinstance(exc, InvalidInput) and not str(exc).startswith("inputs:"):
                    raise  # else a server older than inputs_digest, which wants the archive

                archive = Path(scratch) / "inputs.tar.gz"
                with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
                    tar.add(inputs, arcname=".")
                response = _send(session, path, form, key, makes_run, archive, meter)
        except NotFound as exc:
            if not str(exc).startswith("unknown template"):
                raise
            raise NotFound(f"{exc}; templates are the server's ({session.url})") from None
    return model.model_validate_json(response.content)


def _send(
    session: Session,
    path: str,
    form: dict[str, str],
    key: str,
    makes_run: bool,
    archive: Path | None = None,
    meter: Meter = QUIET,
) -> httpx.Response:
    """The submission's form, with the inputs' archive where there is one."""
    if archive is None:
        if makes_run:
            return session.send_once("POST", path, key=key, data=form)
        return session.send("POST", path, data=form)
    size = archive.stat().st_size
    with archive.open("rb") as raw, meter.track("uploading inputs", size) as tick:
        # httpx takes any file that reads, seeks and tells (IO[bytes] is a wider promise)
        data = cast(IO[bytes], MeteredFile(raw, tick))
        files = {"inputs": ("inputs.tar.gz", data, "application/gzip")}
        if makes_run:
            rewind = functools.partial(data.seek, 0)
            return session.send_once("POST", path, rewind, key=key, data=form, files=files)
        return session.send("POST", path, data=form, files=files)

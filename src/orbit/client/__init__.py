"""`orbit.Client`: ORBIT from Python (scripts, notebooks), over HTTP or in this process.

    from orbit import Client

    client = Client("https://orbit.lab:8470", token)      # or Client.local(), Client.from_env()
    run = client.submit("train.yaml")                      # or a dict shaped like the YAML
    for chunk in run.logs(follow=True):
        print(chunk.decode(), end="")
    record = run.wait()                                    # a RunRecord, as the service has it
    run.collect("out/")
    client.cancel_runs(experiment="sweep", state="running")   # many at once; or ids
    group = client.sweep("train.yaml", sweep=["lr=1e-4,3e-4", "seed=0..4"])  # 10 runs
    client.group(group.id, metric="loss").best            # its lowest-loss runs

It speaks the same ControlAPI as the CLI and returns the same pydantic records.

May import the vocabulary, forensics and the two planes (orbit.core)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orbit.core.control.api import ControlAPI
    from orbit.core.control.views import TemplateView
    from orbit.model.bulk import BulkResult
    from orbit.model.groups import GroupView, RunGroup
    from orbit.model.models import ExecutionOverrides
    from orbit.model.records import CollectResult, ExperimentRecord, RunRecord
    from orbit.model.spec import SubmitSpec


class Client:
    def __init__(self, url: str, token: str | None = None) -> None:
        """The `orbit server` at `url`, shown `token`."""
        from orbit.client.remote import RemoteControl

        self.api: ControlAPI = RemoteControl(url, token)

    @classmethod
    def local(cls, home: str | Path | None = None) -> Client:
        """The control plane in this process, on the store in `home` (default $ORBIT_HOME)."""
        import dataclasses

        from orbit.core.control.service import CoreControlService
        from orbit.model.config import Settings

        settings = Settings.from_env()
        if home is not None:
            root = Path(home).expanduser().absolute()
            settings = dataclasses.replace(
                settings, home=root, database_url=f"sqlite:///{root / 'orbit.db'}"
            )
        return cls._of(CoreControlService.from_settings(settings))

    @classmethod
    def from_env(cls) -> Client:
        """What the CLI would talk to: ORBIT_SERVER/ORBIT_TOKEN, `orbit login`'s, or local."""
        from orbit.client.connect import connect
        from orbit.model.config import Settings

        return cls._of(connect(Settings.from_env()))

    @classmethod
    def _of(cls, api: ControlAPI) -> Client:
        client = cls.__new__(cls)
        client.api = api
        return client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.api.close()

    def submit(
        self,
        spec: str | Path | Mapping[str, Any],
        *,
        base_dir: str | Path | None = None,
        sets: list[str] | None = None,
        allow_dirty: bool = False,
        queue_anyway: bool = False,
        template: str | None = None,
    ) -> Run:
        """Submit a run spec: a YAML file, or a mapping shaped like one (its relative paths
        are relative to `base_dir`, default the current folder). `sets` are --set overrides;
        `template` replaces the spec's template (`orbit submit --template`). A spec with a
        `sweep:` makes a group of runs: submit it with `sweep()`."""
        from orbit.model.errors import InvalidInput
        from orbit.model.spec import to_submission

        parsed, source, folder = _spec(spec, base_dir, sets, template)
        if parsed.sweep is not None:
            raise InvalidInput(f"{source}: sweep: a spec with a sweep makes a group: use sweep()")
        submission = to_submission(parsed, source, allow_dirty, queue_anyway)
        record = self.api.submit_task(submission, base_dir=folder, source=source)
        return Run(self, record)

    def sweep(
        self,
        spec: str | Path | Mapping[str, Any],
        sweep: list[str] | None = None,
        *,
        base_dir: str | Path | None = None,
        sets: list[str] | None = None,
        allow_dirty: bool = False,
        queue_anyway: bool = False,
        template: str | None = None,
    ) -> RunGroup:
        """Submit a spec as a group of runs, one per point of its `sweep:` and of the axes
        `sweep` adds (`orbit submit --sweep`: "lr=1e-4,3e-4", "seed=0..4"). All of them are
        made, or none."""
        from orbit.model.errors import InvalidInput
        from orbit.model.spec import to_submission
        from orbit.model.sweeps import with_flags

        parsed, source, folder = _spec(spec, base_dir, sets, template)
        points = with_flags(parsed.sweep, sweep or [])
        if points is None:
            raise InvalidInput(f"{source}: sweep: give the spec a sweep, or sweep=['KEY=V1,V2']")
        submission = to_submission(parsed, source, allow_dirty, queue_anyway)
        return self.api.submit_sweep(submission, points, base_dir=folder, source=source)

    def groups(
        self, *, experiment: str | None = None, user: str | None = None, limit: int = 50
    ) -> list[RunGroup]:
        """Groups of runs sweeps made, newest first, each with its runs counted by state."""
        return self.api.list_groups(experiment=experiment, user=user, limit=limit)

    def group(self, ref: str, *, metric: str | None = None, higher: bool = False) -> GroupView:
        """A group, its runs in the sweep's order and, by `metric` (logging.jsonl's newest
        value; lower is better unless `higher`), its best and worst runs."""
        return self.api.group_view(ref, metric=metric, goal="max" if higher else "min")

    def run(self, ref: str) -> Run:
        """A run by id (or a unique prefix of one)."""
        return Run(self, self.api.get_run(ref))

    def runs(
        self,
        *,
        experiment: str | None = None,
        state: str | list[str] | None = None,
        limit: int | None = 50,
        user: str | None = None,
        node: str | None = None,
        mine: bool = False,
        group: str | None = None,
    ) -> list[Run]:
        """Runs, newest first; `user` submitted them (`mine`: you), `node` is where their
        current attempt is (an agent node, SSH host or Slurm cluster), `group` a sweep made
        them."""
        from orbit.model.states import RunState

        names = [state] if isinstance(state, str) else list(state or [])
        states = {RunState(s) for s in names} or None
        page = self.api.run_page(
            experiment=experiment,
            states=states,
            limit=limit,
            user=user,
            node=node,
            mine=mine,
            group=group,
        )
        return [Run(self, view.run) for view in page.runs]

    def cancel_runs(
        self,
        *ids: str,
        experiment: str | None = None,
        state: str | list[str] | None = None,
        user: str | None = None,
        group: str | None = None,
        dry_run: bool = False,
    ) -> BulkResult:
        """Cancel these runs, or those a filter matches (`experiment`, `state`, `user`,
        `group`), in one call; the result says what became of each (a run you may not
        control: refused)."""
        selection = _selection(ids, experiment, state, user, group)
        return self.api.cancel_runs(selection, dry_run=dry_run)

    def retry_runs(
        self,
        *ids: str,
        experiment: str | None = None,
        state: str | list[str] | None = None,
        user: str | None = None,
        group: str | None = None,
        dry_run: bool = False,
    ) -> BulkResult:
        """A new attempt of each of these ended runs, or of those a filter matches (a sweep's
        failed ones: group=G, state="failed")."""
        selection = _selection(ids, experiment, state, user, group)
        return self.api.retry_runs(selection, dry_run=dry_run)

    def templates(self) -> list[TemplateView]:
        return self.api.list_templates()

    def experiments(self) -> list[ExperimentRecord]:
        return self.api.list_experiments()


class Run:
    """One run: its record as last seen (`.record`; its fields read through, `run.state`),
    and what can be done with it."""

    def __init__(self, client: Client, record: RunRecord) -> None:
        self.client = client
        self.record = record

    def __getattr__(self, name: str) -> Any:
        return getattr(self.record, name)

    def __repr__(self) -> str:
        return f"<Run {self.record.id} {self.record.state.value}>"

    @property
    def api(self) -> ControlAPI:
        return self.client.api

    def refresh(self) -> RunRecord:
        self.record = self.api.refresh_run_status(self.record.id)
        return self.record

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> RunRecord:
        """Until the run ends (or `timeout` seconds); its record then."""
        self.record = self.api.wait_for(self.record.id, timeout_s=timeout, poll_s=poll)
        return self.record

    def cancel(self, wait: float | None = None) -> RunRecord:
        self.record = self.api.cancel_run(self.record.id, wait_s=wait)
        return self.record

    def retry(self, overrides: ExecutionOverrides | None = None) -> RunRecord:
        self.record = self.api.retry_run(self.record.id, overrides)
        return self.record

    def collect(self, dest: str | Path, attempt: int | None = None) -> CollectResult:
        return self.api.collect_run_artifacts(self.record.id, Path(dest), attempt)

    def logs(
        self,
        *,
        follow: bool = False,
        layer: str = "training",
        attempt: int | None = None,
        tail: int | None = None,
        since: datetime | None = None,
    ) -> Iterator[bytes]:
        """The log's bytes as they come; with `follow`, until the run ends (through its
        automatic retries, each announced by a `--- attempt N ---` line, as the CLI prints).
        `tail`: only its last N lines (then what comes); `since` (with its zone): only what
        was written after it (as `orbit logs --tail N --since WHEN`)."""
        from orbit.model.layers import LogLayer

        chosen = LogLayer(layer)
        start = None
        if tail is not None or since is not None:
            place = self.api.find_log_start(
                self.record.id, chosen, lines=tail, since=since, attempt=attempt
            )
            start = (place.offset, place.attempt_id)
        pieces: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=64)
        stop = threading.Event()

        def put(item: bytes | BaseException | None) -> None:
            while not stop.is_set():  # a reader that went away must not hold this thread
                try:
                    pieces.put(item, timeout=0.2)
                    return
                except queue.Full:
                    continue
            raise _Stopped

        def pump() -> None:
            try:
                self._pump(chosen, attempt, follow, put, start)
                put(None)
            except _Stopped:
                return
            except BaseException as exc:
                try:
                    put(exc)
                except _Stopped:
                    return

        threading.Thread(target=pump, name=f"logs-{self.record.id}", daemon=True).start()
        try:
            while True:
                item = pieces.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()  # the caller stopped reading (or the log ended): the pump stops too

    def _pump(
        self,
        layer: Any,
        attempt: int | None,
        follow: bool,
        put: Any,
        start: tuple[int, str] | None,
    ) -> None:
        import time

        offset, current = start or (0, None)
        while True:
            chunk = self.api.stream_log(
                self.record.id, layer, offset, put, attempt, only_attempt=current, follow=follow
            )
            if current is not None and chunk.attempt_id != current:
                put(f"--- attempt {chunk.attempt} ---\n".encode())
                offset, current = 0, chunk.attempt_id
                continue
            current = chunk.attempt_id
            got, offset = chunk.offset != offset, chunk.offset
            if not follow:
                return
            if got:
                continue
            if chunk.ended:
                record = self.api.refresh_run_status(self.record.id)
                if attempt is not None or record.current.id == current:
                    self.record = record
                    return
                continue
            self.api.refresh_run_status(self.record.id)
            time.sleep(0.5)


def _spec(
    spec: str | Path | Mapping[str, Any],
    base_dir: str | Path | None,
    sets: list[str] | None,
    template: str | None,
) -> tuple[SubmitSpec, str, Path]:
    """The spec parsed, what to call it in errors, and the folder its paths are relative to."""
    from orbit.model.spec import load_spec, spec_of

    if isinstance(spec, Mapping):
        data = dict(spec) | ({"template": template} if template is not None else {})
        return spec_of(data, "spec", sets), "spec", Path(base_dir or Path.cwd()).resolve()
    path = Path(spec)
    folder = Path(base_dir) if base_dir else path.resolve().parent
    return load_spec(path, sets, template), str(path), folder.resolve()


def _selection(
    ids: tuple[str, ...],
    experiment: str | None,
    state: str | list[str] | None,
    user: str | None,
    group: str | None,
) -> Any:
    from orbit.model.bulk import RunSelection
    from orbit.model.states import RunState

    names = [state] if isinstance(state, str) else list(state or [])
    states = tuple(RunState(s) for s in names)
    return RunSelection(ids=ids, experiment=experiment, states=states, user=user, group=group)


class _Stopped(Exception):
    """The reader of Run.logs stopped: the thread feeding it ends."""

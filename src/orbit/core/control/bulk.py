"""Cancel or retry many runs in one call: by ids, or by a filter (experiment, group, state, user).
Each run is acted on as `cancel_run`/`retry_run` act on one (audited per run, as one), after a
check of whether the caller may control it (`may`: the server's rule, a member controls only
its own runs); a run it may not is reported refused, never left out in silence. Nothing is
done in a dry run. Unknown ids refuse the whole call before anything is done."""

from __future__ import annotations

from collections.abc import Callable

from orbit.core.control.base import ServicePart
from orbit.model.bulk import MAX_RUNS, BulkItem, BulkOutcome, BulkResult, RunSelection
from orbit.model.errors import InvalidInput, OrbitError
from orbit.model.records import RunRecord
from orbit.model.states import RunState

# who may control a run: None if the caller may, else why not (one line)
MayControl = Callable[[RunRecord], str | None]


class BulkActions(ServicePart):
    def cancel_runs(
        self, selection: RunSelection, *, dry_run: bool = False, may: MayControl | None = None
    ) -> BulkResult:
        """Ask every selected run that has not ended to stop (SIGTERM, then SIGKILL after its
        grace: this does not wait for that), newest first."""
        runs = self._selected(selection, newest_first=True)
        items = tuple(self._cancel_one(run, dry_run, may) for run in runs)
        return self._report("cancel", selection, dry_run, items)

    def retry_runs(
        self, selection: RunSelection, *, dry_run: bool = False, may: MayControl | None = None
    ) -> BulkResult:
        """A new attempt of every selected run that has ended, oldest first."""
        runs = self._selected(selection, newest_first=False)
        items = tuple(self._retry_one(run, dry_run, may) for run in runs)
        return self._report("retry", selection, dry_run, items)

    def _selected(self, selection: RunSelection, newest_first: bool) -> list[RunRecord]:
        problem = selection.problem()
        if problem is not None:
            raise InvalidInput(problem)
        if selection.ids:
            ids = dict.fromkeys(self.store.runs.resolve_run_id(ref) for ref in selection.ids)
            look = (
                self.parts.lifecycle.refresh_run_status
                if self.config.looks_on_read
                else self.store.runs.get_run
            )
            runs = [look(run_id) for run_id in ids]  # embedded: as they stand where they run
        else:
            experiment = selection.experiment
            experiment_id = (
                self.store.experiments.get_experiment(experiment).id if experiment else None
            )
            group = selection.group
            group_id = self.store.groups.resolve_group_id(group) if group else None

            def matching(states: set[RunState] | None) -> list[RunRecord]:
                return self.store.runs.select_runs(
                    experiment_id=experiment_id,
                    states=states,
                    user=selection.user,
                    limit=MAX_RUNS + 1,
                    viewer=selection.viewer,
                    group_id=group_id,
                )

            if self.config.looks_on_read:  # embedded: the states a filter reads are looked at first
                self.parts.lifecycle.refresh_active(
                    matching({s for s in RunState if not s.terminal})
                )
            runs = matching(set(selection.states) or None)
            if len(runs) > MAX_RUNS:
                raise InvalidInput(
                    f"the filter ({selection.describe()}) matches more than {MAX_RUNS:,} runs: "
                    "narrow it"
                )
        runs.sort(key=lambda r: (r.created_at, r.id), reverse=newest_first)
        return runs

    def _cancel_one(self, run: RunRecord, dry_run: bool, may: MayControl | None) -> BulkItem:
        refused = may(run) if may is not None else None
        if refused is not None:
            return _item(run, BulkOutcome.REFUSED, refused)
        if run.state.terminal:
            return _item(run, BulkOutcome.ALREADY_ENDED)
        if dry_run:
            return _item(run, BulkOutcome.WOULD_CANCEL)
        try:
            after = self.parts.actions.cancel_run(run.id, wait_s=0)
        except OrbitError as exc:
            return _item(run, BulkOutcome.FAILED, str(exc))
        if not after.current.cancel_requested:  # it had ended by the time it was looked at
            return _item(after, BulkOutcome.ALREADY_ENDED)
        return _item(after, BulkOutcome.CANCELLED, "" if after.state.terminal else "stopping")

    def _retry_one(self, run: RunRecord, dry_run: bool, may: MayControl | None) -> BulkItem:
        refused = may(run) if may is not None else None
        if refused is not None:
            return _item(run, BulkOutcome.REFUSED, refused)
        if not run.state.terminal and (dry_run or not self.config.looks_on_read):
            return _item(run, BulkOutcome.NOT_ENDED, "cancel it first")
        if dry_run:
            return _item(run, BulkOutcome.WOULD_RETRY)
        try:
            after = self.parts.actions.retry_run(run.id)
        except OrbitError as exc:
            if not self.store.runs.get_run(run.id).state.terminal:
                return _item(run, BulkOutcome.NOT_ENDED, "cancel it first")
            return _item(run, BulkOutcome.FAILED, str(exc))
        return _item(after, BulkOutcome.RETRIED)

    def _report(
        self, action: str, selection: RunSelection, dry_run: bool, items: tuple[BulkItem, ...]
    ) -> BulkResult:
        result = BulkResult(action=action, dry_run=dry_run, selection=selection, items=items)
        if items and not dry_run:  # each run's own events say what was done to it
            self.store.audit.record_event(
                self.actor,
                f"runs.{action}",
                selection=selection.model_dump(mode="json", exclude_defaults=True),
                counts=result.counts(),
            )
        return result


def _item(run: RunRecord, outcome: BulkOutcome, message: str = "") -> BulkItem:
    return BulkItem(
        run=run.id,
        user=run.created_by,
        state=run.state,
        outcome=outcome,
        message=message,
        attempt=run.current.number,
    )

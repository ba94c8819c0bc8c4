"""The parts of the control service by name, for the calls between them: a launch that fails
ends its attempt (lifecycle), an ended attempt's retry is launched (launching), a submit asks
for a pass (scheduling). CoreControlService makes each part and names it here before any part
is called; a part reaches another only through this."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orbit.core.control.accounts import Accounts
    from orbit.core.control.actions import RunActions
    from orbit.core.control.bulk import BulkActions
    from orbit.core.control.clusters import Clusters
    from orbit.core.control.dependencies import DependencyGate
    from orbit.core.control.launching import Launching
    from orbit.core.control.lifecycle import Lifecycle
    from orbit.core.control.nodes import Nodes
    from orbit.core.control.reading import Reading
    from orbit.core.control.sched_queries import SchedulerQueries
    from orbit.core.control.scheduling import Scheduling
    from orbit.core.control.storage import Storage
    from orbit.core.control.submit import Submitting


class Parts:
    gate: DependencyGate  # `after:`: holds a launch back until what it waits for has ended
    launching: Launching  # claim, stage, start: the one launch path
    lifecycle: Lifecycle  # look, end (the state move), retry
    scheduling: Scheduling  # passes of the scheduler and the placements they launch
    submitting: Submitting  # validate, shape, freeze, create
    actions: RunActions  # cancel, retry, replay
    bulk: BulkActions  # actions on the runs a filter selects
    reading: Reading  # views, logs, evidence, inspect, diff, collect
    storage: Storage  # pin, delete, gc, usage
    sched_queries: SchedulerQueries  # explain, queue, quotas, simulate
    accounts: Accounts
    nodes: Nodes
    clusters: Clusters

"""The experiments part of the control service: experiments made, listed (without the restricted
ones a viewer is not a member of), shown, and restricted to their members or opened again,
with members added and removed (each change audited by the store)."""

from __future__ import annotations

from collections.abc import Sequence

from orbit.core.control.base import ServicePart
from orbit.model.records import ExperimentRecord


class Experiments(ServicePart):
    def create_experiment(self, name: str) -> ExperimentRecord:
        return self.store.experiments.create_experiment(name, self.actor)

    def list_experiments(self, viewer: str | None = None) -> list[ExperimentRecord]:
        """`viewer`: without the restricted ones that user is not a member of."""
        return self.store.experiments.list_experiments(viewer)

    def get_experiment(self, name: str) -> ExperimentRecord:
        return self.store.experiments.get_experiment(name)

    def set_experiment(
        self,
        name: str,
        restricted: bool | None = None,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
    ) -> ExperimentRecord:
        """Restrict an experiment to its members (or open it), and add or remove members
        (an added one must be a user)."""
        exps, found = self.store.experiments, self.store.experiments.get_experiment(name)
        for user in add:
            exps.set_member(found.id, self.store.users.get_user(user).name, True, self.actor)
        for user in remove:
            exps.set_member(found.id, user, False, self.actor)
        if restricted is not None:
            exps.restrict(found.id, restricted, self.actor)
        return exps.get_experiment(found.id)

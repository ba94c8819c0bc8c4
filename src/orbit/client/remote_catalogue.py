"""Templates and experiments through `orbit server` (orbit.client.remote's RemoteControl names
these methods as its own): listed, shown, made, and a restricted experiment's members."""

from __future__ import annotations

from collections.abc import Sequence

from orbit.client.session import Session, part
from orbit.core.control.views import TemplateView
from orbit.model.records import ExperimentRecord


class RemoteCatalogue:
    def __init__(self, session: Session) -> None:
        self.session = session

    def list_templates(self) -> list[TemplateView]:
        return self.session.get_list(TemplateView, "/templates")

    def get_template(self, template_id: str) -> TemplateView:
        return self.session.get(TemplateView, f"/templates/{part(template_id)}")

    def create_experiment(self, name: str) -> ExperimentRecord:
        return self.session.post(ExperimentRecord, "/experiments", {"name": name})

    def list_experiments(self, viewer: str | None = None) -> list[ExperimentRecord]:
        """Those the caller sees (`viewer` is the server's to decide)."""
        return self.session.get_list(ExperimentRecord, "/experiments")

    def get_experiment(self, name: str) -> ExperimentRecord:
        return self.session.get(ExperimentRecord, f"/experiments/{part(name)}")

    def set_experiment(
        self,
        name: str,
        restricted: bool | None = None,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
    ) -> ExperimentRecord:
        body = {"restricted": restricted, "add": list(add), "remove": list(remove)}
        response = self.session.send("PATCH", f"/experiments/{part(name)}", json=body)
        return ExperimentRecord.model_validate_json(response.content)

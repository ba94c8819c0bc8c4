"""The control plane: CoreControlService, the one API that the CLI, the HTTP server, the
Python client and the web page call (`api.ControlAPI`), and the records it hands back
(`views`). `connect` gives a client the control plane its settings name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orbit.core.config import Settings
    from orbit.core.control.api import ControlAPI


def connect(settings: Settings) -> ControlAPI:
    """The control plane the settings name: `orbit server` at ORBIT_SERVER (or the one
    `orbit login` saved), shown ORBIT_TOKEN; else the one in this process (embedded: the store
    in $ORBIT_HOME or at ORBIT_DATABASE_URL). Imported on use, so that a command that never
    reaches the control plane (`--help`) does not pay for loading it."""
    if settings.server:
        from orbit.client.remote import RemoteControl

        return RemoteControl(settings.server, settings.token)
    from orbit.core.control.service import CoreControlService

    return CoreControlService.from_settings(settings)

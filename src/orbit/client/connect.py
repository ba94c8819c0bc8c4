"""`connect`: the control plane a client's settings name, over HTTP or in this process."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orbit.client.meter import Meter
    from orbit.core.control.api import ControlAPI
    from orbit.model.config import Settings


def connect(settings: Settings, meter: Meter | None = None) -> ControlAPI:
    """The control plane the settings name: `orbit server` at ORBIT_SERVER (or the one
    `orbit login` saved), shown ORBIT_TOKEN; else the one in this process (embedded: the store
    in $ORBIT_HOME or at ORBIT_DATABASE_URL). A server's transfers tell `meter` how far they
    got. Imported on use, so that a command that never reaches the control plane (`--help`)
    does not pay for loading it."""
    if settings.server:
        from orbit.client.meter import QUIET
        from orbit.client.remote import RemoteControl

        return RemoteControl(settings.server, settings.token, meter=meter or QUIET)
    from orbit.core.control.service import CoreControlService

    return CoreControlService.from_settings(settings)

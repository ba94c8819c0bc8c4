"""The `orbit` command line: a client of the control plane (see orbit.core.control.api).

May import the vocabulary, orbit.client, and of the control plane only its interface."""

import os

# ORBIT uses no pydantic plugins, and looking for them reads every installed package's metadata:
# a cost each command would pay before doing anything (Typer loads pydantic when it starts)
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

"""The check every run's environment passes before anything is frozen or sent: each name is a
name a process can be given, no name looks like a secret's (orbit.model.secret_names), and no
value has a credential's shape (orbit.model.secret_shapes).

A refusal is one line that names the field (`env.HF_TOKEN`) and never the value, and says where
secrets go instead: SECRETS_HINT, the one place that wording lives. The same function runs in
the client before a remote submit and in the control plane before freezing, so both modes say
the same line."""

from __future__ import annotations

import re
from collections.abc import Mapping

from orbit.model.errors import InvalidInput, Refused
from orbit.model.secret_names import looks_secret
from orbit.model.secret_shapes import secret_shape

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

SECRETS_HINT = (
    "ORBIT never freezes secret values into a bundle or the store; keep it as a secret "
    "(`orbit secrets set NAME`, value from a file or stdin) and name it in the spec's "
    "`secrets: {ENV: NAME}` (README: Secrets)"
)


def check_env(env: Mapping[str, str]) -> None:
    """Refuse the first env entry that cannot be passed to a process or looks like a secret."""
    for name, value in env.items():
        field = f"env.{name}"
        if not ENV_NAME.match(name):
            raise InvalidInput(
                f"{field}: not an environment variable name "
                "(letters, digits and _, not starting with a digit)"
            )
        if "\x00" in value:
            raise InvalidInput(f"{field}: a NUL byte cannot be passed to a process")
        if looks_secret(name):
            raise Refused(f"{field}: the name looks like a secret's; {SECRETS_HINT}")
        kind = secret_shape(value)
        if kind is not None:
            raise Refused(f"{field}: the value looks like {kind}; {SECRETS_HINT}")

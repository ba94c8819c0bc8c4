"""Errors a user can cause and fix. The CLI prints them as one line and exits 2."""

from __future__ import annotations


class OrbitError(Exception):
    """A mistake in the user's input or a refusal: shown as one line, never as a traceback."""

    exit_code = 2


class InvalidInput(OrbitError):
    """A file, field or value is not what was expected."""


class NotFound(OrbitError):
    """An id or name that the store, a registry or the disk does not know."""


class Refused(OrbitError):
    """A valid request that ORBIT will not carry out (an override outside the whitelist...)."""


class InputsWanted(Refused):
    """A submission named its inputs by digest, and the server does not hold them for this
    user: the client sends them (orbit.client.uploads does so by itself)."""


class NoBackend(OrbitError):
    """No execution backend is registered for a placement and launch mode."""


class IllegalTransition(Exception):
    """A state move outside the table: a bug or a race, never a user's mistake."""


def pydantic_location(loc: tuple[int | str, ...]) -> str:
    """`("task", "args", 0)` -> `task.args.0`: the form every ORBIT error uses for a field."""
    return ".".join(str(part) for part in loc) or "(top level)"


def describe_validation_error(
    source: str, exc: object, model: object = None, also: tuple[str, ...] = ()
) -> str:
    """One line for the first problem in a pydantic ValidationError, naming file and field.
    An unknown key goes first (a misspelt `tsk` is why `task` is missing), named with the
    nearest key `model` knows at that place (`also`: more keys its top level takes)."""
    from pydantic import ValidationError

    assert isinstance(exc, ValidationError)
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc = tuple(first["loc"])
    where = pydantic_location(loc)
    message = str(first["msg"]).removeprefix("Value error, ")
    for e in unknown:
        said, meant = _unknown(model, tuple(e["loc"]), also)
        message = said if e is first else message
        # the field it was meant to be is then missing: one mistake, said once
        errors = [m for m in errors if tuple(m["loc"]) != (*tuple(e["loc"])[:-1], meant)]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {where}: {message}{more}"


def _unknown(model: object, loc: tuple[int | str, ...], also: tuple[str, ...]) -> tuple[str, str]:
    """`unknown key; did you mean task?` and the key meant (or ""), where `model` tells."""
    from orbit.model.keys import known_keys, nearest, unknown_key

    known = known_keys(model, loc[:-1]) if model is not None else None
    if known is None:
        return "unknown key", ""
    if len(loc) == 1:
        known = [*known, *also]
    word = str(loc[-1])
    return unknown_key(word, known), nearest(word, known) or ""


class Unreachable(OrbitError):
    """A host did not answer (down, network gone, key refused): its runs keep their state."""

    exit_code = 3


class StoreError(Exception):
    """The database failed: it cannot be reached or opened, or it refused a statement. Wraps the
    driver's own error (its `__cause__`). Not a user's mistake in the usual sense, but said in
    one line all the same: which store, and what to check."""

    @property
    def first_line(self) -> str:
        """What the driver said, in one line (its first), or the error's name."""
        text = str(self).strip()
        return text.splitlines()[0] if text else type(self).__name__


class Unauthorized(OrbitError):
    """No token, or one the server does not accept (unknown, revoked, expired)."""


class Forbidden(OrbitError):
    """A valid token whose user's role may not do this (a viewer submitting, a member
    cancelling someone else's run)."""


class ServerError(OrbitError):
    """`orbit server` failed to answer as it should (its store is down, a bug): said in one
    line, with what the server said."""

    exit_code = 1


# The errors a server answer may carry, by the name it gives them (problem details' `error`)
BY_NAME: dict[str, type[OrbitError]] = {
    cls.__name__: cls
    for cls in (
        OrbitError,
        InvalidInput,
        NotFound,
        Refused,
        InputsWanted,
        NoBackend,
        Unreachable,
        Unauthorized,
        Forbidden,
        ServerError,
    )
}

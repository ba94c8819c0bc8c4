"""Who is at the console: a session cookie that holds the caller's own API token (HttpOnly,
SameSite=Lax, Secure under TLS, never outliving the token), looked up on every request like a
bearer header, so that a revoked token's session ends at its next request; the CSRF token every
form post must carry; and the one-time sign-in links that `orbit ui` prints.

A request with `Authorization: Bearer` is taken as it is on the API (scripts fetch pages too);
it carries no ambient credential, so it needs no CSRF token."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

from fastapi import Request
from starlette.responses import RedirectResponse, Response

from orbit.model.auth import TokenRecord

PREFIX = "/ui"
COOKIE = "orbit_session"
LOGIN_CSRF = "orbit_login_csrf"  # the sign-in form's own (double-submit: no session yet)
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-orbit-csrf"  # htmx sends it on every request it makes (hx-headers)
SESSION_S = 12 * 3600  # a session lasts at most this long, and never past its token's expiry
LINK_S = 120.0  # a sign-in link works once, within this long
# pages anyone may fetch: the sign-in form, a sign-in link, signing out (/ui/login/out), the
# console's own files
OPEN = ("/ui/login", "/ui/static/")


def is_open(path: str) -> bool:
    """The sign-in form, a sign-in link, signing out, and the console's own files."""
    return path == "/ui/login" or path.startswith(OPEN[1]) or path.startswith("/ui/login/")


def csrf_for(secret: str) -> str:
    """The CSRF token of a session: a MAC of the session's token (stateless: the server keeps
    nothing, and a page read by another site's script cannot be made without the cookie)."""
    return hmac.new(secret.encode(), b"orbit-console-csrf", hashlib.sha256).hexdigest()


NOTICE = "orbit_notice"  # a line the next page shows once (a cookie: no other site can set it)
NOTICE_S = 15


def say_next(response: Response, line: str, path: str) -> Response:
    """`line` on the page at `path`, when the browser comes to it next (in the next seconds).
    Not in the URL: a link from elsewhere cannot make the console say anything."""
    response.set_cookie(NOTICE, quote(line[:300]), max_age=NOTICE_S, path=path, httponly=True,
                        samesite="strict")  # fmt: skip
    return response


def to_sign_in(path: str, query: str, why: str | None) -> Response:
    """A console page asked for without a session: to the sign-in form, which comes back here."""
    target = path + (f"?{query}" if query else "")
    response = RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='')}", status_code=303)
    return say_next(response, why, f"{PREFIX}/login") if why else response


def notice_of(request: Request) -> str | None:
    from urllib.parse import unquote

    found = request.cookies.get(NOTICE)
    return unquote(found) if found else None


def start_session(response: Response, secret: str, token: TokenRecord, secure: bool) -> None:
    """Set the session cookie: for the console's paths only, gone with its token or sooner."""
    age = SESSION_S
    if token.expires_at is not None:
        age = min(age, int((token.expires_at - datetime.now(UTC)).total_seconds()))
    response.set_cookie(
        COOKIE,
        secret,
        max_age=max(age, 1),
        path=PREFIX,
        httponly=True,
        samesite="lax",
        secure=secure,
    )


def end_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path=PREFIX)


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a console path of this server, never elsewhere."""
    if not target or not target.startswith(f"{PREFIX}/") or target.startswith("//"):
        return f"{PREFIX}/"
    if "\\" in target or "\n" in target or "\r" in target:
        return f"{PREFIX}/"
    return target


@dataclass
class SignInLinks:
    """One-time sign-in links: a random code for a token, good once and for LINK_S seconds.
    Kept in this server's memory only (a restart forgets them: ask for another)."""

    clock: object = time.monotonic
    _codes: dict[str, tuple[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def make(self, secret: str) -> str:
        code = secrets.token_urlsafe(24)
        now = self.clock()  # type: ignore[operator]
        with self._lock:
            self._codes = {c: v for c, v in self._codes.items() if v[1] > now}
            self._codes[code] = (secret, now + LINK_S)
        return code

    def peek(self, code: str) -> str | None:
        """The token a code stands for, while it is good, without using it up."""
        with self._lock:
            found = self._codes.get(code)
        if found is None or found[1] <= self.clock():  # type: ignore[operator]
            return None
        return found[0]

    def take(self, code: str) -> str | None:
        with self._lock:
            found = self._codes.pop(code, None)
        if found is None or found[1] <= self.clock():  # type: ignore[operator]
            return None
        return found[0]

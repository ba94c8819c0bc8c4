"""What a role lets its users do: every permission ORBIT knows, the built-in roles as sets of
them (admin, member and viewer, which allow exactly what they always have), and a site's own
roles from the server config. Pure: the server asks `Roles.grants` once per request, for the
one permission its route names (orbit.server.permissions)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from orbit.model.auth import Role
from orbit.model.models import Strict

# each permission, and what it lets a user do (the phrase a refusal says). A name ending in
# `.own` has a wider `.any` beside it: the same, for anyone's runs
PERMISSIONS: dict[str, str] = {
    "runs.read": "see runs, experiments, templates and the queue",
    "runs.submit": "submit runs",
    "runs.cancel.own": "cancel their own runs",
    "runs.cancel.any": "cancel anyone's runs",
    "runs.retry.own": "retry their own runs",
    "runs.retry.any": "retry anyone's runs",
    "logs.read.own": "read their own runs' logs",
    "logs.read.any": "read anyone's runs' logs",
    "artifacts.read.own": "collect their own runs' artifacts",
    "artifacts.read.any": "collect anyone's runs' artifacts",
    "storage.read": "see what runs keep on disk",
    "storage.keep.own": "pin, unpin and delete their own runs",
    "storage.keep.any": "pin, unpin and delete anyone's runs",
    "storage.gc": "collect what retention lets go",
    "fleet.read": "see nodes, hosts, clusters, quotas and the scheduler's settings",
    "nodes.manage": "drain, label, revoke and remove nodes",
    "nodes.join": "make and revoke agents' join tokens",
    "nodes.files": "push files to nodes and pull files from them",
    "hosts.manage": "add, check and remove SSH hosts and Slurm clusters",
    "quotas.write": "set quotas and the scheduler's settings",
    "experiments.manage": "restrict experiments, name their members and see every run",
    "policy.read": "see and check the submission policy",
    "policy.write": "apply the submission policy, or diff and review it",
    "secrets.read": "list secrets' names (never their values)",
    "secrets.write": "keep secrets of their own",
    "secrets.shared.write": "set and remove experiments' and everyone's secrets",
    "secrets.rotate": "rotate the key that seals secrets",
    "users.manage": "add and remove users, and manage anyone's tokens",
    "alerts.read": "see alerts and their rules",
    "alerts.manage": "acknowledge and silence alerts",
    "audit.read": "read and verify the audit trail",
    "metrics.read": "read the server's metrics",
    "account.self": "see who they are and keep tokens of their own",
}

_VIEWER = frozenset(
    {
        "runs.read",
        "logs.read.any",
        "artifacts.read.any",
        "storage.read",
        "fleet.read",
        "policy.read",
        "secrets.read",
        "alerts.read",
        "audit.read",
        "metrics.read",
        "account.self",
    }
)
_MEMBER = _VIEWER | {
    "runs.submit",
    "runs.cancel.own",
    "runs.retry.own",
    "storage.keep.own",
    "secrets.write",
}
BUILT_IN: dict[str, frozenset[str]] = {
    Role.ADMIN.value: frozenset(PERMISSIONS),
    Role.MEMBER.value: _MEMBER,
    Role.VIEWER.value: _VIEWER,
}
ROLE_NAME = r"^[a-z][a-z0-9-]{0,15}$"  # the store keeps a role in 16 characters


def wider(permission: str) -> str | None:
    """The permission that allows the same for anyone (`runs.cancel.any` beside
    `runs.cancel.own`), or None."""
    if permission.endswith(".own"):
        return permission.removesuffix(".own") + ".any"
    return None


def check_permission(name: str) -> str:
    if name not in PERMISSIONS:
        close = [p for p in PERMISSIONS if p.split(".")[0] == name.split(".")[0]]
        hint = f" (of {name.split('.')[0]}: {', '.join(close)})" if close else ""
        raise ValueError(f"unknown permission {name!r}{hint}; see `orbit users roles`")
    return name


class SiteRole(Strict):
    """A role of the site's own: the permissions of a built-in role it starts from (`base`),
    and more of its own."""

    description: str = Field(default="", max_length=200)
    base: Role | None = None
    permissions: list[str] = Field(default=[], max_length=len(PERMISSIONS))

    @field_validator("permissions")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        return [check_permission(n) for n in names]

    def granted(self) -> frozenset[str]:
        start = BUILT_IN[self.base.value] if self.base is not None else frozenset()
        return start | frozenset(self.permissions)


def check_site_roles(roles: dict[str, SiteRole]) -> dict[str, SiteRole]:
    for name in roles:
        if name in BUILT_IN:
            raise ValueError(f"{name!r} is built in: name a role of the site's another way")
        if not re.fullmatch(ROLE_NAME, name):
            raise ValueError(
                f"role name {name!r}: use 1-16 lowercase letters, digits or '-', "
                "starting with a letter"
            )
    return roles


class RoleView(Strict):
    """A role as `orbit users roles` shows it."""

    name: str
    built_in: bool
    description: str
    permissions: list[str]


class Roles:
    """The roles a server knows: the built-in ones and the site's (server setting `roles`)."""

    def __init__(self, site: dict[str, SiteRole] | None = None) -> None:
        self.site = dict(site or {})
        self._granted = {**BUILT_IN, **{n: r.granted() for n, r in self.site.items()}}

    def names(self) -> list[str]:
        return list(self._granted)

    def known(self, role: str) -> bool:
        return role in self._granted

    def check(self, role: str, field: str = "role") -> str:
        from orbit.model.errors import InvalidInput

        if role not in self._granted:
            raise InvalidInput(
                f"{field}: unknown role {role!r} (one of {', '.join(self._granted)}; "
                "a site's own are the server setting `roles`)"
            )
        return role

    def grants(self, role: str, permission: str) -> bool:
        """Whether `role` holds `permission` (for a `.own` one: it, or its `.any`). A role
        the server no longer knows (its setting was removed) holds nothing."""
        held = self._granted.get(role, frozenset())
        return permission in held or wider(permission) in held

    def views(self) -> list[RoleView]:
        described = {
            Role.ADMIN.value: "everything, users and hosts included",
            Role.MEMBER.value: "submits runs, and controls its own",
            Role.VIEWER.value: "reads",
        }
        return [
            RoleView(
                name=name,
                built_in=name in BUILT_IN,
                description=described.get(name) or self.site[name].description,
                permissions=sorted(granted),
            )
            for name, granted in self._granted.items()
        ]

"""Roles as sets of permissions: the built-in ones allow exactly what admin, member and viewer
always have, a site's own roles are checked when the server config is read, and a `.own`
permission is held by whoever holds its `.any`."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbit.model.errors import InvalidInput
from orbit.model.permissions import BUILT_IN, PERMISSIONS, Roles, SiteRole, wider
from orbit.server.config import load_config

# what each built-in role could do before roles were sets of permissions: read everything,
# submit, control its own runs, control anyone's, and the admin's (users, hosts, nodes...)
BEFORE = {
    "admin": (True, True, True, True, True),
    "member": (True, True, True, False, False),
    "viewer": (True, False, False, False, False),
}
READ = ("runs.read", "logs.read.any", "artifacts.read.any", "fleet.read", "audit.read")
CONTROL_OWN = ("runs.cancel.own", "runs.retry.own", "storage.keep.own")
CONTROL_ANY = ("runs.cancel.any", "runs.retry.any", "storage.keep.any")
ADMIN = (
    "users.manage",
    "hosts.manage",
    "nodes.manage",
    "nodes.join",
    "nodes.files",
    "quotas.write",
    "policy.write",
    "secrets.shared.write",
    "secrets.rotate",
    "alerts.manage",
    "storage.gc",
    "experiments.manage",
)


@pytest.mark.parametrize("role", list(BEFORE))
def test_the_built_in_roles_allow_what_they_always_have(role: str) -> None:
    roles = Roles()
    read, submit, own, anyone, admin = BEFORE[role]
    assert all(roles.grants(role, p) is read for p in READ)
    assert roles.grants(role, "runs.submit") is submit
    assert all(roles.grants(role, p) is own for p in CONTROL_OWN)
    assert all(roles.grants(role, p) is anyone for p in CONTROL_ANY)
    assert all(roles.grants(role, p) is admin for p in ADMIN)
    assert BUILT_IN["admin"] == frozenset(PERMISSIONS)


def test_an_own_permission_is_held_by_whoever_holds_its_any() -> None:
    roles = Roles({"auditor": SiteRole(permissions=["logs.read.any"])})
    assert roles.grants("auditor", "logs.read.own") and roles.grants("auditor", "logs.read.any")
    assert not roles.grants("auditor", "runs.read")
    assert wider("runs.cancel.own") == "runs.cancel.any" and wider("runs.read") is None
    # a user whose role the server no longer knows holds nothing
    assert not roles.grants("gone", "runs.read")


def test_a_site_role_starts_from_a_built_in_one_and_adds_its_own(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        "roles:\n"
        "  operator:\n"
        "    description: drains nodes and stops anyone's run\n"
        "    base: viewer\n"
        "    permissions: [runs.cancel.any, nodes.manage]\n",
        encoding="utf-8",
    )
    roles = load_config(config).known_roles()
    assert roles.names() == ["admin", "member", "viewer", "operator"]
    assert roles.grants("operator", "runs.cancel.any") and roles.grants("operator", "runs.read")
    assert not roles.grants("operator", "quotas.write")
    assert not roles.grants("operator", "policy.write")
    view = {v.name: v for v in roles.views()}["operator"]
    assert not view.built_in and "nodes.manage" in view.permissions
    with pytest.raises(InvalidInput, match=r"role: unknown role 'intern' \(one of admin, "):
        roles.check("intern")


@pytest.mark.parametrize(
    ("yaml", "said"),
    [
        (
            "roles: {operator: {permissions: [nodes.mange]}}",
            "roles.operator.permissions: unknown permission 'nodes.mange' (of nodes: "
            "nodes.manage, nodes.join, nodes.files); see `orbit users roles`",
        ),
        (
            "roles: {admin: {permissions: [runs.read]}}",
            "roles: 'admin' is built in: name a role of the site's another way",
        ),
        (
            "roles: {Ops Team: {permissions: []}}",
            "roles: role name 'Ops Team': use 1-16 lowercase letters, digits or '-', "
            "starting with a letter",
        ),
        ("roles: {ops: {base: root}}", "roles.ops.base: "),
        (
            "local_roles: [ops]",
            "local_roles: unknown role 'ops' (one of admin, member, viewer)",
        ),
    ],
)
def test_a_bad_role_in_the_server_config_is_named_in_one_line(
    tmp_path: Path, yaml: str, said: str
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(yaml + "\n", encoding="utf-8")
    with pytest.raises(InvalidInput) as raised:
        load_config(config)
    message = str(raised.value)
    assert message.startswith(f"{config}: ") and said in message, message
    assert "\n" not in message

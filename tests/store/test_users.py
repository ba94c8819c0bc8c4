"""Users, tokens and the reconcile leases in the store, on real SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from orbit.model.auth import Role, new_token, token_hash
from orbit.model.errors import InvalidInput, NotFound, Refused
from orbit.model.models import FailureReason, RunState
from orbit.store import Store
from tests.store.raw import execute, query
from tests.store.test_repository import ACTOR, make_run, race

S = RunState


def now() -> datetime:
    return datetime.now(UTC)


def test_users_are_added_listed_and_removed_with_an_audit(store: Store) -> None:
    assert store.users.count_users() == 0
    root = store.users.create_user("root", Role.ADMIN, ACTOR)
    assert root.role == "admin" and root.created_by == ACTOR and root.id.startswith("user-")
    store.users.create_user("bob", Role.MEMBER, "root")
    store.users.create_user("alice.v_2-x", Role.VIEWER, "root")
    assert [u.name for u in store.users.list_users()] == ["alice.v_2-x", "bob", "root"]
    assert store.users.get_user("root") == root
    assert store.users.count_users() == 3

    with pytest.raises(InvalidInput, match="user 'bob' already exists"):
        store.users.create_user("bob", Role.ADMIN, ACTOR)
    for bad in ["", "-bob", "bob smith", "a" * 65, "bøb", "bob/x"]:
        with pytest.raises(InvalidInput, match="user name"):
            store.users.create_user(bad, Role.MEMBER, ACTOR)
    store.users.create_user("b" * 64, Role.MEMBER, ACTOR)

    removed = store.users.remove_user("bob", "root")
    assert removed.name == "bob" and removed.role == Role.MEMBER
    with pytest.raises(NotFound, match="no user 'bob'"):
        store.users.get_user("bob")
    with pytest.raises(NotFound, match="no user 'bob'"):
        store.users.remove_user("bob", "root")

    events = [(e.actor, e.action, e.data) for e in store.audit.list_events()]
    assert events[:3] == [
        (ACTOR, "user.add", {"user": "root", "role": "admin"}),
        ("root", "user.add", {"user": "bob", "role": "member"}),
        ("root", "user.add", {"user": "alice.v_2-x", "role": "viewer"}),
    ]
    assert events[-1] == ("root", "user.remove", {"user": "bob", "role": "member", "tokens": 0})
    assert store.audit.verify_audit() == []


def test_the_last_admin_is_not_removed(store: Store) -> None:
    store.users.create_user("root", Role.ADMIN, ACTOR)
    store.users.create_user("viewer", Role.VIEWER, ACTOR)
    with pytest.raises(Refused, match="user 'root' is the last admin; add another admin first"):
        store.users.remove_user("root", ACTOR)
    store.users.create_user("second", Role.ADMIN, ACTOR)
    store.users.remove_user("root", ACTOR)
    with pytest.raises(Refused, match="'second' is the last admin"):
        store.users.remove_user("second", ACTOR)
    store.users.remove_user("viewer", ACTOR)  # no admin left is not a reason to keep others
    assert [u.name for u in store.users.list_users()] == ["second"]


def test_a_role_changes_with_an_audit_and_the_last_admin_keeps_theirs(store: Store) -> None:
    store.users.create_user("root", Role.ADMIN, ACTOR)
    store.users.create_user("otto", "operator", ACTOR)  # a site's role: the store keeps names
    assert store.users.get_user("otto").role == "operator"
    changed = store.users.set_role("otto", "viewer", "root")
    assert changed.role == "viewer" and store.users.get_user("otto").role == "viewer"
    event = store.audit.list_events()[-1]
    assert (event.action, event.actor) == ("user.role", "root")
    assert event.data == {"user": "otto", "role": "viewer", "was": "operator"}
    with pytest.raises(Refused, match="user 'root' is the last admin"):
        store.users.set_role("root", "member", "root")
    assert store.users.get_user("root").role == "admin"
    with pytest.raises(NotFound):
        store.users.set_role("nobody", "viewer", "root")
    # the same role again changes nothing and writes no event
    events = len(store.audit.list_events())
    store.users.set_role("otto", "viewer", "root")
    assert len(store.audit.list_events()) == events


def test_tokens_are_created_listed_and_revoked(store: Store) -> None:
    store.users.create_user("alice", Role.MEMBER, ACTOR)
    store.users.create_user("bob", Role.VIEWER, ACTOR)
    expires = now() + timedelta(days=30)
    first = store.users.create_token(
        "alice", token_hash=token_hash(new_token()), name="laptop", expires_at=expires, actor=ACTOR
    )
    assert first.user == "alice" and first.name == "laptop" and first.id.startswith("tok-")
    assert first.expires_at == expires and first.revoked_at is None and first.last_used_at is None
    second = store.users.create_token(
        "alice", token_hash=token_hash(new_token()), name=None, expires_at=None, actor="alice"
    )
    bobs = store.users.create_token(
        "bob", token_hash=token_hash(new_token()), name="ci", expires_at=None, actor=ACTOR
    )
    assert store.users.get_token(first.id) == first
    assert [t.id for t in store.users.list_tokens("alice")] == [second.id, first.id]
    assert [t.id for t in store.users.list_tokens()] == [bobs.id, second.id, first.id]
    with pytest.raises(NotFound, match="no user 'carol'"):
        store.users.list_tokens("carol")
    with pytest.raises(NotFound, match="no user 'carol'"):
        store.users.create_token(
            "carol", token_hash=token_hash(new_token()), name=None, expires_at=None, actor=ACTOR
        )
    with pytest.raises(NotFound, match="no token 'tok-nope'"):
        store.users.get_token("tok-nope")
    with pytest.raises(ValueError, match="sha256"):  # the plain token is never kept
        store.users.create_token(
            "alice", token_hash=new_token(), name=None, expires_at=None, actor=ACTOR
        )

    revoked = store.users.revoke_token(first.id, "alice")
    assert revoked.revoked_at is not None and revoked.id == first.id
    assert store.users.revoke_token(first.id, ACTOR) == revoked  # again: as it was, no second event
    assert [t.revoked_at is not None for t in store.users.list_tokens("alice")] == [False, True]
    with pytest.raises(NotFound):
        store.users.revoke_token("tok-nope", ACTOR)

    events = [(e.actor, e.action, e.data) for e in store.audit.list_events()][2:]
    assert events == [
        (
            ACTOR,
            "token.create",
            {
                "user": "alice",
                "token_id": first.id,
                "name": "laptop",
                "expires_at": expires.isoformat(),
            },
        ),
        (
            "alice",
            "token.create",
            {"user": "alice", "token_id": second.id, "name": None, "expires_at": None},
        ),
        (
            ACTOR,
            "token.create",
            {"user": "bob", "token_id": bobs.id, "name": "ci", "expires_at": None},
        ),
        ("alice", "token.revoke", {"user": "alice", "token_id": first.id}),
    ]

    # removing a user deletes its tokens with it
    assert store.users.remove_user("alice", ACTOR).name == "alice"
    assert [t.id for t in store.users.list_tokens()] == [bobs.id]
    assert store.audit.list_events()[-1].data == {"user": "alice", "role": "member", "tokens": 2}
    assert store.audit.verify_audit() == []


def test_authenticate_accepts_only_a_live_token_of_an_existing_user(store: Store) -> None:
    store.users.create_user("root", Role.ADMIN, ACTOR)
    store.users.create_user("alice", Role.MEMBER, ACTOR)
    at = now()
    tokens = {name: new_token() for name in ("good", "revoked", "expired", "later", "removed")}

    def make(user: str, name: str, expires_at: datetime | None = None) -> str:
        return store.users.create_token(
            user, token_hash=token_hash(tokens[name]), name=name, expires_at=expires_at, actor=ACTOR
        ).id

    good = make("alice", "good")
    store.users.revoke_token(make("alice", "revoked"), ACTOR)
    make("alice", "expired", at)  # expires_at <= at: expired
    later = make("alice", "later", at + timedelta(seconds=1))
    store.users.create_user("gone", Role.MEMBER, ACTOR)
    make("gone", "removed")
    store.users.remove_user("gone", ACTOR)

    found = store.users.authenticate(token_hash(tokens["good"]), at)
    assert found is not None
    user, token = found
    assert (user.name, user.role, token.id, token.name) == ("alice", Role.MEMBER, good, "good")
    assert store.users.authenticate(token_hash(tokens["later"]), at) is not None
    assert store.users.authenticate(token_hash(tokens["later"]), at + timedelta(seconds=1)) is None
    for name in ("revoked", "expired", "removed"):
        assert store.users.authenticate(token_hash(tokens[name]), at) is None, name
    assert store.users.authenticate(token_hash(new_token()), at) is None
    assert store.users.authenticate(tokens["good"], at) is None  # the plain token is not its hash

    # its use is recorded, at most once a minute
    used = store.users.get_token(good).last_used_at
    assert used == at
    assert (
        store.users.authenticate(token_hash(tokens["good"]), at + timedelta(seconds=30)) is not None
    )
    assert store.users.get_token(good).last_used_at == at
    assert (
        store.users.authenticate(token_hash(tokens["good"]), at + timedelta(seconds=61)) is not None
    )
    assert store.users.get_token(good).last_used_at == at + timedelta(seconds=61)
    assert store.users.get_token(later).last_used_at == at


def test_authenticate_does_not_fail_when_recording_the_use_fails(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orbit.store import StoreError

    store.users.create_user("root", Role.ADMIN, ACTOR)
    token = new_token()
    store.users.create_token(
        "root", token_hash=token_hash(token), name=None, expires_at=None, actor=ACTOR
    )

    def broken() -> None:
        raise StoreError("the store is read-only")

    monkeypatch.setattr(store.users, "_write", broken)
    assert store.users.authenticate(token_hash(token), now()) is not None


def test_neither_token_nor_hash_reaches_the_audit_trail(store: Store) -> None:
    tokens = [new_token() for _ in range(2)]
    store.users.bootstrap_admin(name="root", token_hash=token_hash(tokens[0]), actor="server")
    made = store.users.create_token(
        "root", token_hash=token_hash(tokens[1]), name="x", expires_at=None, actor=ACTOR
    )
    store.users.revoke_token(made.id, ACTOR)
    trail = json.dumps([e.model_dump(mode="json") for e in store.audit.list_events()])
    assert "token.create" in trail and "token.revoke" in trail
    for token in tokens:
        assert token not in trail and token_hash(token) not in trail
        assert token.removeprefix("orbit_") not in trail


def test_bootstrap_admin_creates_the_first_admin_once(store: Store) -> None:
    token = new_token()
    user = store.users.bootstrap_admin(name="root", token_hash=token_hash(token), actor="server")
    assert user is not None and user.name == "root" and user.role == Role.ADMIN
    assert [(t.user, t.name, t.expires_at) for t in store.users.list_tokens()] == [
        ("root", "bootstrap", None)
    ]
    found = store.users.authenticate(token_hash(token), now())
    assert found is not None and found[0] == user
    again = store.users.bootstrap_admin(name="other", token_hash=token_hash(new_token()), actor="x")
    assert again is None
    assert [u.name for u in store.users.list_users()] == ["root"]
    assert [e.action for e in store.audit.list_events()] == ["user.add", "token.create"]
    with pytest.raises(InvalidInput, match="user name"):
        store.users.bootstrap_admin(name="no spaces", token_hash=token_hash(token), actor="x")


def test_bootstrap_admin_waits_for_any_user(store: Store) -> None:
    store.users.create_user("viewer", Role.VIEWER, ACTOR)
    assert (
        store.users.bootstrap_admin(name="root", token_hash=token_hash(new_token()), actor="x")
        is None
    )
    assert store.users.count_users() == 1


def test_replicas_racing_to_bootstrap_create_one_admin(store_url: str) -> None:
    racers = [Store(store_url) for _ in range(4)]
    try:
        for round_ in range(3):
            created = race(
                racers,
                lambda s, i: s.users.bootstrap_admin(
                    name=f"root{i}", token_hash=token_hash(new_token()), actor=f"server-{i}"
                ),
            )
            assert not [c for c in created if isinstance(c, Exception)], created
            made = [c for c in created if c is not None]
            assert len(made) == 1, (round_, created)
            users = racers[0].users.list_users()
            assert [u.name for u in users] == [made[0].name]
            assert len(racers[0].users.list_tokens()) == 1
            assert racers[0].audit.verify_audit() == []
            execute(racers[0], "DELETE FROM tokens")
            execute(racers[0], "DELETE FROM users")
    finally:
        for s in racers:
            s.close()


def test_racing_removals_keep_one_admin(store_url: str) -> None:
    racers = [Store(store_url) for _ in range(2)]
    try:
        racers[0].users.create_user("a0", Role.ADMIN, ACTOR)
        racers[0].users.create_user("a1", Role.ADMIN, ACTOR)
        outcomes = race(racers, lambda s, i: s.users.remove_user(f"a{i}", ACTOR))
        assert sorted(type(o).__name__ for o in outcomes) == ["Refused", "UserRecord"], outcomes
        assert len(racers[0].users.list_users()) == 1
    finally:
        for s in racers:
            s.close()


# --- reconcile leases -------------------------------------------------------------------------


def attempts(store: Store, n: int) -> list[tuple[str, str]]:
    experiment = store.experiments.create_experiment("exp", ACTOR)
    runs = [make_run(store, experiment.id) for _ in range(n)]
    return [(r.id, r.current.id) for r in runs]


def test_claims_lease_attempts_until_due_and_skip_the_ended(store: Store) -> None:
    made = attempts(store, 4)
    ended = made[3][1]
    store.attempts.move_attempt(ended, S.FAILED, actor=ACTOR, reason=FailureReason.LAUNCH_FAILED)
    store.attempts.move_attempt(made[1][1], S.SUBMITTED, actor=ACTOR)
    store.attempts.move_attempt(made[1][1], S.RUNNING, actor=ACTOR)
    at = now()
    lease = at + timedelta(seconds=30)

    first = store.leases.claim_reconcile("a", at=at, lease_until=lease, limit=2)
    second = store.leases.claim_reconcile("b", at=at, lease_until=lease, limit=10)
    assert len(first) == 2 and len(second) == 1
    assert sorted(first + second) == sorted(made[:3])  # the failed one never
    assert store.leases.claim_reconcile("c", at=at, lease_until=lease, limit=10) == []
    assert (
        store.leases.claim_reconcile(
            "c", at=lease - timedelta(seconds=1), lease_until=lease, limit=10
        )
        == []
    )
    assert store.leases.claim_reconcile("a", at=at, lease_until=lease, limit=0) == []

    # a's look is done: due again in 45 s; b's lease runs out and c takes it over until 60 s
    done = first[0][1]
    store.leases.reconcile_done(done, "a", at + timedelta(seconds=45))
    taken = store.leases.claim_reconcile(
        "c", at=lease, lease_until=lease + timedelta(seconds=30), limit=10
    )
    assert sorted(taken) == sorted([first[1], *second])
    store.leases.reconcile_done(second[0][1], "b", at)  # b is stale: c's lease stands
    rows = query(store, "SELECT reconcile_owner FROM attempts WHERE id = :id", id=second[0][1])
    assert rows == [{"reconcile_owner": "c"}]
    assert store.leases.claim_reconcile("d", at=lease, lease_until=lease, limit=10) == []
    assert store.leases.claim_reconcile(
        "d", at=at + timedelta(seconds=45), lease_until=lease, limit=10
    ) == [first[0]]

    # the reads of attempts are as they were, and the bookkeeping is not audited
    states = {r.current.id: r.state for r in store.runs.list_runs()}
    assert states == {
        made[0][1]: S.PREPARED,
        made[1][1]: S.RUNNING,
        made[2][1]: S.PREPARED,
        made[3][1]: S.FAILED,
    }
    assert not [e for e in store.audit.list_events() if "reconcile" in e.action]


def test_the_leases_of_a_gone_owner_are_released_at_once(store: Store) -> None:
    made = attempts(store, 4)
    at = now()
    lease = at + timedelta(seconds=60)
    held = store.leases.claim_reconcile("dead", at=at, lease_until=lease, limit=3)
    assert len(store.leases.claim_reconcile("alive", at=at, lease_until=lease, limit=10)) == 1
    store.attempts.move_attempt(
        held[0][1], S.FAILED, actor=ACTOR, reason=FailureReason.LAUNCH_FAILED
    )
    assert store.leases.reconcile_holders(at) == ["alive", "dead"]
    assert store.leases.reconcile_holders(lease) == []  # all due by then
    assert store.leases.release_reconcile("dead", at) == 2  # the ended attempt is left as it is
    assert store.leases.reconcile_holders(at) == ["alive"]
    # what the gone owner held is due now, and the next claim takes it; the rest wait
    taken = store.leases.claim_reconcile("next", at=at, lease_until=lease, limit=10)
    assert sorted(taken) == sorted(held[1:]) and len(made) == 4


def test_news_from_a_node_makes_an_attempt_due_unless_a_look_is_under_way(store: Store) -> None:
    made = attempts(store, 3)
    at = now()
    lease = at + timedelta(seconds=60)
    looked, looking = store.leases.claim_reconcile("a", at=at, lease_until=lease, limit=2)
    store.leases.reconcile_done(looked[1], "a", at + timedelta(seconds=1))  # due again in 1 s
    soon = at + timedelta(seconds=30)
    # an agent reports all three ended: the one between looks and the never-looked-at one are
    # due now; the one under a look (leased for 60 s) is left to that look
    assert store.leases.make_due([a for _, a in made], at, soon) == 2
    fresh = next(m for m in made if m not in (looked, looking))
    taken = store.leases.claim_reconcile("b", at=at, lease_until=lease, limit=10)
    assert sorted(taken) == sorted([looked, fresh])
    assert store.leases.make_due([], at, soon) == 0


def test_the_longest_due_are_claimed_first(store: Store) -> None:
    made = attempts(store, 3)
    at = now()
    for (_, attempt), due in zip(
        made, [at - timedelta(seconds=5), at - timedelta(seconds=50)], strict=False
    ):
        execute(
            store, "UPDATE attempts SET reconcile_due_at = :due WHERE id = :id", due=due, id=attempt
        )
    order = [
        store.leases.claim_reconcile("a", at=at, lease_until=at + timedelta(hours=1), limit=1)[0]
        for _ in range(3)
    ]
    assert order == [made[2], made[1], made[0]]  # never looked at, then the longest due


def test_concurrent_claims_never_share_an_attempt(store_url: str) -> None:
    setup = Store(store_url)
    racers = [Store(store_url) for _ in range(4)]
    try:
        made = attempts(setup, 40)
        at = now()
        claimed = race(
            racers,
            lambda s, i: (
                f"replica-{i}",
                [
                    pair
                    for _ in range(6)
                    for pair in s.leases.claim_reconcile(
                        f"replica-{i}", at=at, lease_until=at + timedelta(minutes=5), limit=3
                    )
                ],
            ),
        )
        assert not [c for c in claimed if isinstance(c, Exception)], claimed
        every = [pair for _, batch in claimed for pair in batch]
        assert len(every) == len(set(every)), "an attempt was claimed twice"
        assert set(every) == set(made)  # 4 x 6 x 3 claims are more than enough for 40
        owners = query(setup, "SELECT id, reconcile_owner FROM attempts")
        mine = {a: owner for owner, batch in claimed for _, a in batch}
        assert {r["id"]: r["reconcile_owner"] for r in owners} == mine
    finally:
        for s in (setup, *racers):
            s.close()

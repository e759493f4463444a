"""The quota aggregate (services.quota.core): decide/apply round trips, event encoding, tree_of, a fold property
test."""

from __future__ import annotations

import datetime as dt

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from schemas import quota, resources
from schemas import quota_events as ev
from services.quota import validation
from services.quota.core import DEFAULT_TREE, QuotaTreeState, Rejected, decide, replay, tree_of
from services.quota.core import event_tree as tree_of_event
from tests.unit.test_quota_validation import eq

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_events_round_trip_through_json_and_replay() -> None:
    state = QuotaTreeState()
    log: list[ev.QuotaEvent] = []
    commands: list[ev.QuotaCommand] = [
        ev.CreateQuota(command_id="1", quota=eq("org", is_parent=True, min={"cpu": "4"})),
        ev.CreateQuota(command_id="2", quota=eq("a", parent="org", min={"cpu": "2"})),
        ev.PatchQuota(command_id="3", name="a", patch={"spec": {"min": {"cpu": "3"}}}),
        ev.AttachNamespaces(command_id="4", name="a", namespaces=("ns1", "ns2")),
        ev.DetachNamespaces(command_id="5", name="a", namespaces=("ns1",)),
        ev.CreateProfile(
            command_id="6",
            profile=quota.ElasticQuotaProfile(
                metadata=quota.kube.ObjectMeta(name="p"),
                spec=quota.ElasticQuotaProfileSpec(quota_name="gpu-pool", node_selector=quota.LabelSelector()),
            ),
        ),
        ev.DeleteProfile(command_id="7", name="p"),
    ]
    for command in commands:
        events = decide(state, command, now=NOW, actor="bob", pods_by_quota={})
        for event in events:
            assert event.command_id == command.command_id and event.actor == "bob" and event.time == NOW
            state = state.apply(event)
            log.append(ev.decode_quota_event(ev.encode_quota_event(event)))
    assert replay(log) == state
    assert state.specs()["a"].min == {"cpu": 3000}
    assert state.specs()["a"].namespaces == ("ns2",)
    assert not state.profiles
    assert b'"type":"quota.updated.v1"' in ev.encode_quota_event(log[2])


def test_apply_is_copy_on_write() -> None:
    before = QuotaTreeState()
    (event,) = decide(before, ev.CreateQuota(command_id="1", quota=eq("a")), now=NOW, actor="x", pods_by_quota={})
    after = before.apply(event)
    assert "a" in after.quotas and "a" not in before.quotas


def test_patch_cannot_rename_and_unknown_quota_is_rejected() -> None:
    s = replay(
        decide(QuotaTreeState(), ev.CreateQuota(command_id="1", quota=eq("a")), now=NOW, actor="x", pods_by_quota={})
    )
    for command in (
        ev.PatchQuota(command_id="2", name="a", patch={"metadata": {"name": "b"}}),
        ev.PatchQuota(command_id="3", name="zz", patch={}),
        ev.UpdateQuota(command_id="4", quota=eq("zz")),
    ):
        try:
            decide(s, command, now=NOW, actor="x", pods_by_quota={})
        except Rejected as err:
            assert err.violations
        else:
            raise AssertionError(f"{command} accepted")


def test_tree_of() -> None:
    s = replay(
        decide(
            QuotaTreeState(),
            ev.CreateQuota(command_id="1", quota=eq("r", is_parent=True, tree="t1")),
            now=NOW,
            actor="x",
            pods_by_quota={},
        )
    )
    assert tree_of(s, ev.CreateQuota(command_id="2", quota=eq("c", parent="r"))) == "t1"
    assert tree_of(s, ev.DeleteQuota(command_id="3", name="r")) == "t1"
    assert tree_of(s, ev.CreateQuota(command_id="4", quota=eq("d"))) == DEFAULT_TREE
    assert tree_of(s, ev.DeleteQuota(command_id="5", name=quota.ROOT_QUOTA)) == DEFAULT_TREE
    assert tree_of(s, ev.DeleteProfile(command_id="6", name="prof")) == "prof"


NAMES = ["q0", "q1", "q2", "q3", "q4"]
PARENTS = [quota.ROOT_QUOTA, *NAMES]


@st.composite
def commands(draw: st.DrawFn) -> ev.QuotaCommand:
    kind = draw(st.sampled_from(["create"] * 4 + ["update", "patch", "delete", "attach", "detach"]))
    name = draw(st.sampled_from(NAMES))
    cid = str(draw(st.integers(0, 10**9)))
    if kind in ("create", "update"):
        obj = eq(
            name,
            parent=draw(st.sampled_from([quota.ROOT_QUOTA, *PARENTS[: NAMES.index(name) + 1]])),
            is_parent=draw(st.sampled_from([True, True, False])),
            min={"cpu": str(draw(st.integers(0, 8)))},
            max={"cpu": str(draw(st.integers(4, 20))), "memory": "1Gi"},
        )
        return (
            ev.CreateQuota(command_id=cid, quota=obj) if kind == "create" else ev.UpdateQuota(command_id=cid, quota=obj)
        )
    if kind == "patch":
        return ev.PatchQuota(command_id=cid, name=name, patch={"spec": {"min": {"cpu": str(draw(st.integers(0, 12)))}}})
    if kind == "delete":
        return ev.DeleteQuota(command_id=cid, name=name)
    nss = tuple(draw(st.lists(st.sampled_from(["n1", "n2", "n3"]), max_size=2)))
    if kind == "attach":
        return ev.AttachNamespaces(command_id=cid, name=name, namespaces=nss)
    return ev.DetachNamespaces(command_id=cid, name=name, namespaces=nss)


def _check_invariants(state: QuotaTreeState) -> None:
    specs = state.specs()
    bound: dict[str, str] = {}
    for spec in specs.values():
        assert validation.find_cycle(specs, spec.name) is None
        assert resources.leq(spec.min, spec.max) and set(spec.min) <= set(spec.max)
        for ns in spec.namespaces or ():
            assert bound.setdefault(ns, spec.name) == spec.name
        if spec.name == quota.ROOT_QUOTA:
            continue
        assert spec.parent in specs
        children = [c for c in specs.values() if c.parent == spec.name and c.name != quota.ROOT_QUOTA]
        if children:
            assert spec.is_parent
            total = resources.total(c.min for c in children)
            if spec.name != quota.ROOT_QUOTA and not any(c.allow_force_update for c in children):
                assert set(total) <= set(spec.min) and resources.leq(total, spec.min), spec.name


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(commands(), max_size=25))
def test_fold_equals_incremental_state_and_invariants_hold(cmds: list[ev.QuotaCommand]) -> None:
    state = QuotaTreeState()
    log: list[ev.QuotaEvent] = []
    accepted = 0
    for command in cmds:
        try:
            events = decide(state, command, now=NOW, actor="prop", pods_by_quota={})
        except Rejected as err:
            assert err.violations
            continue
        accepted += 1
        for event in events:
            state = state.apply(event)
            log.append(ev.decode_quota_event(ev.encode_quota_event(event)))
        _check_invariants(state)
    assert replay(log) == state
    if accepted:  # every prefix of the log rebuilds a valid state too
        _check_invariants(replay(log[: len(log) // 2]))


def test_an_import_places_parents_first_and_yields_one_event_per_tree() -> None:
    batch = (
        eq("a", parent="org", min={"cpu": "2"}),
        eq("gpu-a", parent="gpu", tree="gpu"),
        eq("org", is_parent=True, min={"cpu": "4"}),
        eq("gpu", is_parent=True, tree="gpu", labels={quota.LABEL_IS_ROOT: "true"}),
    )
    events = decide(
        QuotaTreeState(), ev.ImportQuotas(command_id="i", quotas=batch), now=NOW, actor="x", pods_by_quota={}
    )
    assert [type(e) for e in events] == [ev.QuotasImported, ev.QuotasImported]
    by_tree = {tree_of_event(e): [q.metadata.name for q in e.quotas] for e in events}  # type: ignore[union-attr]
    assert by_tree == {DEFAULT_TREE: ["org", "a"], "gpu": ["gpu", "gpu-a"]}
    state = replay(events)
    assert state.specs()["a"].parent == "org" and state.specs()["gpu-a"].tree_id == "gpu"
    again = decide(state, ev.ImportQuotas(command_id="j", quotas=batch), now=NOW, actor="x", pods_by_quota={})
    assert again == []  # nothing changed: nothing to append


def test_an_import_reports_every_violation_and_appends_nothing() -> None:
    batch = (
        eq("org", is_parent=True, min={"cpu": "4"}),
        eq("a", parent="org", min={"cpu": "3"}),
        eq("b", parent="org", min={"cpu": "3"}),  # Σ min 6 > org's 4
        eq("c", parent="missing"),
        eq("x", parent="y", is_parent=True),
        eq("y", parent="x", is_parent=True),  # a cycle
        eq("a", parent="org"),  # twice
    )
    try:
        decide(QuotaTreeState(), ev.ImportQuotas(command_id="i", quotas=batch), now=NOW, actor="x", pods_by_quota={})
    except Rejected as rejected:
        rules = sorted({(v.quota, v.rule) for v in rejected.violations})
    else:
        raise AssertionError("the import was accepted")
    assert ("a", "name-unique") in rules and ("b", "min-sum") in rules
    assert any(q == "c" for q, _ in rules) and {("x", "no-cycle"), ("y", "no-cycle")} <= set(rules)

"""The quota service's model: events fold into per-tree runtime trees, pods resolve and count, nodes make the total,
terminating-pod options, re-resolution when quotas appear, tree roots' totals, and unusable events."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import pytest

from schemas import kube, quota
from schemas import quota_events as ev
from services.quota.admission import CheckOptions
from services.quota.core import DEFAULT_TREE, Rejected
from services.quota.model import ModelOptions, QuotaModel
from tests.unit.test_quota_validation import eq

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
T = NOW.timestamp()


def node(name: str, cpu: str, memory: str = "100Gi") -> kube.Node:
    return msgspec.convert(
        {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": memory}}}, kube.Node
    )


def pod(
    name: str, cpu: str, *, namespace: str = "apps", quota_name: str = "", node_name: str = "", **meta: Any
) -> kube.Pod:
    labels = {quota.LABEL_QUOTA_NAME: quota_name} if quota_name else {}
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": namespace, "labels": labels, **meta},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        },
        kube.Pod,
    )


def run(model: QuotaModel, *commands: ev.QuotaCommand) -> list[ev.QuotaEvent]:
    applied: list[ev.QuotaEvent] = []
    for command in commands:
        for event in model.decide(command, now=NOW, actor="alice"):
            seq = model.events_seq + 1
            model.apply_event(event, seq=seq, tree=DEFAULT_TREE)
            applied.append(event)
    model.refresh()
    return applied


def team_model(**options: Any) -> QuotaModel:
    """40 cores; org (parent, min 30) holds a and b (min 15 each, max 40)."""
    model = QuotaModel(ModelOptions(**options))
    model.set_node("n1", node("n1", "40"))
    run(
        model,
        ev.CreateQuota(command_id="1", quota=eq("org", is_parent=True, min={"cpu": "30"}, max={"cpu": "40"})),
        ev.CreateQuota(command_id="2", quota=eq("a", parent="org", min={"cpu": "15"}, max={"cpu": "40"})),
        ev.CreateQuota(command_id="3", quota=eq("b", parent="org", min={"cpu": "15"}, max={"cpu": "40"})),
    )
    return model


def state(model: QuotaModel, name: str) -> quota.QuotaState:
    found = model.state_of(name)
    assert found is not None
    return found


def test_pending_pods_count_in_request_assigned_ones_in_used_too() -> None:
    model = team_model()
    model.set_pod("apps/p1", pod("p1", "10", quota_name="a"), now=T)
    model.set_pod("apps/p2", pod("p2", "20", quota_name="a", node_name="n1"), now=T)
    changed = model.refresh()
    assert {"a", "org"} <= changed[DEFAULT_TREE]
    a = state(model, "a")
    assert a.request == {"cpu": 30_000} and a.used == {"cpu": 20_000}
    assert state(model, "org").used == {"cpu": 20_000}
    # a asks 30 of org's 40; b asks nothing and lends its min: a gets its whole request
    assert a.runtime == {"cpu": 30_000}
    assert model.pods_by_quota() == {"a": 2}
    model.set_pod("apps/p2", None, now=T)
    model.refresh()
    assert state(model, "a").used == {} and state(model, "a").request == {"cpu": 10_000}


def test_every_object_carries_the_sequence_of_its_event_and_replay_gives_the_same_state() -> None:
    model = QuotaModel()
    events = run(
        model,
        ev.CreateQuota(command_id="1", quota=eq("org", is_parent=True, min={"cpu": "30"}, max={"cpu": "40"})),
        ev.CreateQuota(command_id="2", quota=eq("b", parent="org", min={"cpu": "15"}, max={"cpu": "40"})),
        ev.PatchQuota(command_id="3", name="b", patch={"spec": {"min": {"cpu": "10"}}}),
    )
    assert model.state.quotas["org"].metadata.resource_version == "1"
    assert model.state.quotas["b"].metadata.resource_version == "3"
    assert model.tree_seq == {DEFAULT_TREE: 3} and model.events_seq == 3
    fresh = QuotaModel()
    for seq, event in enumerate(events, start=1):
        fresh.apply_event(ev.decode_quota_event(ev.encode_quota_event(event)), seq=seq, tree=DEFAULT_TREE)
    fresh.refresh()
    assert fresh.state == model.state
    assert fresh.state_of("b") == model.state_of("b")


def test_pods_move_to_a_quota_that_claims_their_namespace() -> None:
    model = team_model()
    model.set_pod("web/p", pod("p", "4", namespace="web", node_name="n1"), now=T)
    model.refresh()
    assert model.pods_by_quota() == {quota.DEFAULT_QUOTA: 1}
    run(model, ev.AttachNamespaces(command_id="9", name="b", namespaces=("web",)))
    assert model.pods_by_quota() == {"b": 1}
    assert state(model, "b").used == {"cpu": 4_000}
    assert state(model, quota.DEFAULT_QUOTA).used == {}


def test_a_quota_with_pods_cannot_be_deleted() -> None:
    model = team_model()
    model.set_pod("apps/p", pod("p", "1", quota_name="b"), now=T)
    with pytest.raises(Rejected, match="still has 1 pod"):
        model.decide(ev.DeleteQuota(command_id="x", name="b"), now=NOW, actor="alice")
    model.set_pod("apps/p", None, now=T)
    run(model, ev.DeleteQuota(command_id="y", name="b"))
    assert model.tree_of_quota("b") is None and "b" not in model.tree(DEFAULT_TREE)


def terminating_pod(deleted_at: float, grace: int | None) -> kube.Pod:
    stamp = dt.datetime.fromtimestamp(deleted_at, dt.UTC).isoformat().replace("+00:00", "Z")
    extra: dict[str, Any] = {"deletionTimestamp": stamp}
    if grace is not None:
        extra["deletionGracePeriodSeconds"] = grace
    return pod("p", "5", quota_name="a", node_name="n1", **extra)


@pytest.mark.parametrize(
    ("option", "used_now", "used_after_grace"),
    [("count", 5_000, 5_000), ("ignore-immediately", 0, 0), ("ignore-after-grace", 5_000, 0)],
)
def test_terminating_pods_follow_the_feature_gates(option: Any, used_now: int, used_after_grace: int) -> None:
    model = team_model(terminating=option)
    model.set_pod("apps/p", terminating_pod(T, 60), now=T + 10)
    model.refresh()
    assert state(model, "a").used.get("cpu", 0) == used_now
    model.tick(T + 59)
    model.refresh()
    assert state(model, "a").used.get("cpu", 0) == used_now
    model.tick(T + 60)
    model.refresh()
    assert state(model, "a").used.get("cpu", 0) == used_after_grace


def test_the_default_grace_period_applies_when_the_pod_does_not_say() -> None:
    model = team_model(terminating="ignore-after-grace")
    model.set_pod("apps/p", terminating_pod(T, None), now=T)
    model.tick(T + 29)
    model.refresh()
    assert state(model, "a").used == {"cpu": 5_000}
    model.tick(T + 30)
    model.refresh()
    assert state(model, "a").used == {}


def test_nodes_make_the_total_and_a_tree_root_takes_its_share_off_the_default_tree() -> None:
    model = team_model()
    model.set_node("n2", node("n2", "60"))
    model.refresh()
    assert model.tree(DEFAULT_TREE).total["cpu"] == 100_000
    gpu_root = eq(
        "gpu-root",
        tree="gpu",
        max={"cpu": "1000"},
        labels={quota.LABEL_IS_ROOT: "true", quota.LABEL_IS_PARENT: "true"},
        annotations={quota.ANNOTATION_TOTAL_RESOURCE: '{"cpu":"25"}'},
    )
    run(model, ev.CreateQuota(command_id="g", quota=gpu_root))
    assert model.tree_of_quota("gpu-root") == "gpu"
    assert model.tree("gpu").total == {"cpu": 25_000}
    assert model.tree(DEFAULT_TREE).total["cpu"] == 75_000
    assert state(model, "gpu-root").runtime == {"cpu": 0}  # nothing requested yet
    ignoring = msgspec.structs.replace(
        gpu_root,
        metadata=msgspec.structs.replace(
            gpu_root.metadata, labels={**gpu_root.metadata.labels, quota.LABEL_IGNORE_DEFAULT_TREE: "true"}
        ),
    )
    run(model, ev.UpdateQuota(command_id="h", quota=ignoring))
    assert model.tree(DEFAULT_TREE).total["cpu"] == 100_000
    model.set_node("n2", None)
    model.refresh()
    assert model.tree(DEFAULT_TREE).total["cpu"] == 40_000


def test_nodes_joining_after_the_first_refresh_change_the_root_and_the_tree_alone() -> None:
    """Only the three system quotas, nodes arriving later (as under `koordbus up --simulate-nodes`, or a node joining
    a cluster): no child's runtime moves, yet the root's runtime and the tree's total do, so both are published."""
    model = QuotaModel(ModelOptions())
    model.refresh()
    assert model.tree(DEFAULT_TREE).total == {}
    model.set_node("n1", node("n1", "32", "128Gi"))
    model.set_node("n2", node("n2", "16", "64Gi"))
    changed = model.refresh()
    assert changed == {DEFAULT_TREE: {quota.ROOT_QUOTA}}
    assert model.tree(DEFAULT_TREE).total == {"cpu": 48_000, "memory": 192 * 2**30}
    assert state(model, quota.ROOT_QUOTA).runtime == {"cpu": 48_000, "memory": 192 * 2**30}
    assert model.refresh() == {}  # nothing changed since
    model.set_node("n2", node("n2", "16", "64Gi"))  # the same node observed again
    assert model.refresh() == {}


def test_a_pod_of_the_default_quota_changes_the_root_whose_runtime_is_the_total_less_it() -> None:
    """The root's runtime is the cluster total less what the system and default quotas use: a pod of the default
    quota (a namespace no quota claims) changes it even when no child's runtime moves, so the root is published."""
    model = team_model()
    before = state(model, quota.ROOT_QUOTA).runtime
    model.set_pod("web/p1", pod("p1", "4", namespace="web", node_name="n1"), now=T)
    changed = model.refresh()
    assert quota.ROOT_QUOTA in changed[DEFAULT_TREE]
    assert state(model, quota.ROOT_QUOTA).runtime == {**before, "cpu": before["cpu"] - 4_000}
    model.set_pod("web/p1", None, now=T)
    assert quota.ROOT_QUOTA in model.refresh()[DEFAULT_TREE]
    assert state(model, quota.ROOT_QUOTA).runtime == before


def test_an_unreadable_event_changes_nothing_but_its_sequence_is_seen() -> None:
    model = team_model()
    before = model.state
    bad = ev.QuotaUpdated(quota=eq("a", parent="org", min={"cpu": "lots"}), actor="mallory", time=NOW, command_id="bad")
    with pytest.raises(quota.QuotaFormatError):
        model.apply_event(bad, seq=7, tree=DEFAULT_TREE)
    assert model.state is before
    assert model.tree_seq[DEFAULT_TREE] == 7
    assert state(model, "a").min == {"cpu": 15_000}


def test_what_if_reports_the_runtime_diff_and_changes_nothing() -> None:
    model = team_model()
    model.set_pod("apps/p1", pod("p1", "30", quota_name="a"), now=T)
    model.set_pod("apps/p2", pod("p2", "30", quota_name="b"), now=T)
    model.refresh()
    before = {n: state(model, n) for n in ("org", "a", "b")}
    assert before["a"].runtime == {"cpu": 20_000} and before["b"].runtime == {"cpu": 20_000}
    result = model.what_if(
        [
            ev.PatchQuota(command_id="w1", name="a", patch={"spec": {"min": {"cpu": "25"}}}),  # Σ min 40 > org 30
            ev.PatchQuota(command_id="w2", name="b", patch={"spec": {"min": {"cpu": "5"}}}),
        ],
        [(pod("more", "10", quota_name="a"), 2, False)],
        now=NOW,
        actor="alice",
    )
    assert [v.rule for v in result.violations] == ["min-sum"]
    changes = {name: (was, after) for name, was, after in result.changes}
    assert set(changes) >= {"a", "b"}
    was_a, after_a = changes["a"]
    assert was_a == before["a"] and after_a is not None
    assert after_a.request == {"cpu": 50_000}
    # b's min 5 and a asking 50: a keeps its min 15 + the larger share of the 20-core pool
    assert after_a.runtime["cpu"] + changes["b"][1].runtime["cpu"] == 40_000  # type: ignore[union-attr]
    assert after_a.runtime["cpu"] > 20_000
    assert {n: state(model, n) for n in ("org", "a", "b")} == before
    assert model.state.quotas["b"].spec.min == {"cpu": "15"}


def test_what_if_a_new_quota_and_its_pods() -> None:
    model = team_model()
    result = model.what_if(
        [ev.CreateQuota(command_id="c", quota=eq("c", max={"cpu": "8"}))],
        [(pod("x", "6", quota_name="c"), 1, True)],
        now=NOW,
        actor="alice",
    )
    changes = {name: (was, after) for name, was, after in result.changes}
    was_c, after_c = changes["c"]
    assert was_c is None and after_c is not None
    assert after_c.used == {"cpu": 6_000} and after_c.runtime == {"cpu": 6_000}
    assert "c" not in model.tree(DEFAULT_TREE)
    assert model.what_if([], [], now=NOW, actor="alice").changes == []


def test_check_resolves_each_pod_in_its_own_tree_and_reserves_in_order() -> None:
    model = team_model()
    gpu_root = eq(
        "gpu-root",
        tree="gpu",
        min={"cpu": "4"},
        max={"cpu": "4"},
        labels={quota.LABEL_IS_ROOT: "true"},
        annotations={quota.ANNOTATION_TOTAL_RESOURCE: '{"cpu":"4"}'},
    )
    run(model, ev.CreateQuota(command_id="g", quota=gpu_root))
    verdicts = model.check(
        [pod("g1", "3", quota_name="gpu-root"), pod("g2", "3", quota_name="gpu-root"), pod("a1", "3", quota_name="a")],
        options=CheckOptions(),
    )
    assert [v.fits for v in verdicts] == [True, False, True]
    assert "exceeds runtime 4" in verdicts[1].reasons[0]


def test_invariants_are_checked_after_every_change() -> None:
    """Lowering a's max below what its running pods use breaks used ≤ max (a and its parent org); raising it back
    clears both. Min scaling off with Σ min above the total breaks the children's-runtime sum at the root."""
    model = team_model()
    model.set_pod("apps/p", pod("p", "30", quota_name="a", node_name="n1"), now=T)
    model.refresh()
    assert model.problems == {}
    run(model, ev.PatchQuota(command_id="m", name="a", patch={"spec": {"max": {"cpu": "20"}}}))
    assert model.problems == {"a": ["quota a: used cpu 30 exceeds max 20"]}
    run(model, ev.PatchQuota(command_id="n", name="a", patch={"spec": {"max": {"cpu": "40"}}}))
    assert model.problems == {}

    unscaled = team_model(enable_min_quota_scale=False)
    unscaled.set_node("n1", node("n1", "20"))  # total 20 < org's min 30
    unscaled.set_pod("apps/q", pod("q", "30", quota_name="a"), now=T)
    unscaled.refresh()
    assert any("children's runtimes sum to cpu 30" in p for p in unscaled.problems[quota.ROOT_QUOTA])


def test_the_commands_the_log_applied_are_known_by_id_the_most_recent_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.quota import model as model_module

    monkeypatch.setattr(model_module, "COMMANDS_KEPT", 2)
    model = QuotaModel()
    run(model, ev.CreateQuota(command_id="c1", quota=eq("a", min={"cpu": "1"}, max={"cpu": "2"})))
    applied = model.applied_command("c1")
    assert applied is not None and (applied.seq, applied.tree) == (1, DEFAULT_TREE)
    (created,) = applied.events
    assert isinstance(created, ev.QuotaCreated) and created.quota.metadata.resource_version == "1"  # as stored
    assert model.applied_command("") is None and model.applied_command("unknown") is None
    run(model, ev.DeleteQuota(command_id="c2", name="a"))
    run(model, ev.CreateQuota(command_id="c3", quota=eq("b", min={"cpu": "1"}, max={"cpu": "2"})))
    assert model.applied_command("c1") is None  # the oldest, past COMMANDS_KEPT
    assert [model.applied_command(c) is not None for c in ("c2", "c3")] == [True, True]

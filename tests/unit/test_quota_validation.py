"""§3.9 quota validation: one test per rule (accept and reject), all violations at once, cycles, wording."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from schemas import kube, quota
from schemas import quota_events as ev
from services.quota import validation
from services.quota.core import QuotaTreeState, Rejected, decide

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def eq(
    name: str,
    *,
    parent: str | None = None,
    is_parent: bool = False,
    tree: str = "",
    min: dict[str, Any] | None = None,
    max: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    used: dict[str, Any] | None = None,
) -> quota.ElasticQuota:
    lab = dict(labels or {})
    if parent:
        lab[quota.LABEL_PARENT] = parent
    if is_parent:
        lab[quota.LABEL_IS_PARENT] = "true"
    if tree:
        lab[quota.LABEL_TREE_ID] = tree
    return quota.ElasticQuota(
        metadata=kube.ObjectMeta(name=name, namespace="ns", labels=lab, annotations=annotations or {}),
        spec=quota.ElasticQuotaSpec(min=min or {}, max=max if max is not None else {"cpu": "10", "memory": "10Gi"}),
        status=quota.ElasticQuotaStatus(used=used),
    )


def run(state: QuotaTreeState, command: ev.QuotaCommand, pods: dict[str, int] | None = None) -> QuotaTreeState:
    for event in decide(state, command, now=NOW, actor="alice", pods_by_quota=pods or {}):
        state = state.apply(event)
    return state


def create(state: QuotaTreeState, obj: quota.ElasticQuota) -> QuotaTreeState:
    return run(state, ev.CreateQuota(command_id=f"c-{obj.metadata.name}", quota=obj))


def rules(state: QuotaTreeState, command: ev.QuotaCommand, pods: dict[str, int] | None = None) -> set[str]:
    with pytest.raises(Rejected) as info:
        decide(state, command, now=NOW, actor="alice", pods_by_quota=pods or {})
    return {v.rule for v in info.value.violations}


@pytest.fixture
def base() -> QuotaTreeState:
    s = create(QuotaTreeState(), eq("org", is_parent=True, min={"cpu": "8", "memory": "8Gi"}))
    return create(s, eq("team-a", parent="org", min={"cpu": "4", "memory": "4Gi"}))


def test_defaults_parent_label_and_tree_id_and_shared_weight() -> None:
    s = create(QuotaTreeState(), eq("t-root", is_parent=True, tree="t1"))
    s = create(
        s, eq("t-leaf", parent="t-root", annotations={quota.ANNOTATION_SHARED_WEIGHT: '{"cpu": "3", "gpu": "1"}'})
    )
    s = create(s, eq("plain"))
    leaf = s.quotas["t-leaf"]
    assert leaf.metadata.labels[quota.LABEL_TREE_ID] == "t1"
    assert json.loads(leaf.metadata.annotations[quota.ANNOTATION_SHARED_WEIGHT]) == {"cpu": "3", "memory": "10Gi"}
    assert s.quotas["plain"].metadata.labels[quota.LABEL_PARENT] == quota.ROOT_QUOTA


def test_well_known_quotas_exist_implicitly() -> None:
    assert set(QuotaTreeState().quotas) == quota.SPECIAL_QUOTAS


def test_non_negative() -> None:
    assert "non-negative" in rules(QuotaTreeState(), ev.CreateQuota(command_id="x", quota=eq("a", max={"cpu": "-1"})))
    create(QuotaTreeState(), eq("a", max={"cpu": "0"}))


def test_min_keys_in_max_and_min_le_max_message() -> None:
    with pytest.raises(Rejected) as info:
        decide(
            QuotaTreeState(),
            ev.CreateQuota(command_id="x", quota=eq("team-a", min={"cpu": "12", "gpu": "1"}, max={"cpu": "10"})),
            now=NOW,
            actor="a",
            pods_by_quota={},
        )
    messages = [v.message for v in info.value.violations]
    assert "quota team-a: spec.min.cpu 12 exceeds spec.max.cpu 10 (min must not exceed max)" in messages
    assert {v.rule for v in info.value.violations} == {"min-keys-in-max", "min-le-max"}
    assert {v.field for v in info.value.violations} == {"spec.min.cpu", "spec.min.gpu"}
    create(QuotaTreeState(), eq("team-a", min={"cpu": "10"}, max={"cpu": "10"}))


def test_max_strict_check_keys_vs_used() -> None:
    ann = {quota.ANNOTATION_MAX_STRICT_CHECK_RESOURCE_KEYS: '["cpu"]'}
    bad = eq("a", max={"cpu": "2"}, used={"cpu": "3"}, annotations=ann)
    assert rules(QuotaTreeState(), ev.CreateQuota(command_id="x", quota=bad)) == {"max-strict-check"}
    create(QuotaTreeState(), eq("a", max={"cpu": "2"}, used={"cpu": "3"}))  # not strictly checked


def test_name_unique(base: QuotaTreeState) -> None:
    assert "name-unique" in rules(base, ev.CreateQuota(command_id="x", quota=eq("team-a", parent="org")))


def test_namespace_bound_to_one_quota(base: QuotaTreeState) -> None:
    s = run(base, ev.AttachNamespaces(command_id="n", name="team-a", namespaces=("ns1",)))
    ann = {quota.ANNOTATION_NAMESPACES: '["ns1"]'}
    assert rules(s, ev.CreateQuota(command_id="x", quota=eq("b", annotations=ann))) == {"namespace-unique"}
    s = run(s, ev.DetachNamespaces(command_id="d", name="team-a", namespaces=("ns1",)))
    create(s, eq("b", annotations=ann))


def test_root_and_system_immutable_default_updatable() -> None:
    s = QuotaTreeState()
    changed = eq(quota.SYSTEM_QUOTA, parent=quota.ROOT_QUOTA, max={"cpu": "1"})
    assert "immutable-quota" in rules(s, ev.UpdateQuota(command_id="x", quota=changed))
    run(s, ev.UpdateQuota(command_id="y", quota=eq(quota.DEFAULT_QUOTA, parent=quota.ROOT_QUOTA, max={"cpu": "1"})))


@pytest.mark.parametrize("name", sorted(quota.SPECIAL_QUOTAS))
def test_special_quotas_undeletable(name: str) -> None:
    assert "undeletable" in rules(QuotaTreeState(), ev.DeleteQuota(command_id="x", name=name))


def test_delete_with_children_or_pods(base: QuotaTreeState) -> None:
    assert rules(base, ev.DeleteQuota(command_id="x", name="org")) == {"delete-with-children"}
    assert rules(base, ev.DeleteQuota(command_id="x", name="team-a"), {"team-a": 2}) == {"delete-with-pods"}
    s = run(base, ev.DeleteQuota(command_id="y", name="team-a"), {"other": 3})
    assert "team-a" not in s.quotas
    run(s, ev.DeleteQuota(command_id="z", name="org"))


def test_is_parent_transition(base: QuotaTreeState) -> None:
    leafed = eq("org", min={"cpu": "8", "memory": "8Gi"})
    assert "is-parent-with-children" in rules(base, ev.UpdateQuota(command_id="x", quota=leafed))
    s = run(base, ev.DeleteQuota(command_id="d", name="team-a"))
    run(s, ev.UpdateQuota(command_id="y", quota=leafed))


def test_tree_id_immutable_and_equal_with_parent(base: QuotaTreeState) -> None:
    moved = eq("team-a", parent="org", min={"cpu": "4", "memory": "4Gi"}, tree="t9")
    assert {"tree-id-immutable", "tree-id-parent"} <= rules(base, ev.UpdateQuota(command_id="x", quota=moved))
    s = create(QuotaTreeState(), eq("r", is_parent=True, tree="t1"))
    assert "tree-id-parent" in rules(s, ev.CreateQuota(command_id="x", quota=eq("c", parent="r", tree="t2")))


def test_parent_exists_and_is_parent(base: QuotaTreeState) -> None:
    assert rules(base, ev.CreateQuota(command_id="x", quota=eq("b", parent="nope"))) == {"parent-exists"}
    assert rules(base, ev.CreateQuota(command_id="x", quota=eq("b", parent="team-a"))) == {"parent-is-parent"}


def test_key_consistency_with_parent_and_children(base: QuotaTreeState) -> None:
    child = eq("b", parent="org", max={"cpu": "1", "gpu": "1"})
    assert rules(base, ev.CreateQuota(command_id="x", quota=child)) == {"keys-in-parent"}
    narrowed = eq("org", is_parent=True, min={"cpu": "8"}, max={"cpu": "10"})
    assert "keys-of-children" in rules(base, ev.UpdateQuota(command_id="x", quota=narrowed))


def test_sum_of_min_completely(base: QuotaTreeState) -> None:
    over = eq("b", parent="org", min={"cpu": "5"})
    assert rules(base, ev.CreateQuota(command_id="x", quota=over)) == {"min-sum"}
    create(base, eq("b", parent="org", min={"cpu": "4"}))
    shrink = eq("org", is_parent=True, min={"cpu": "3", "memory": "8Gi"})
    assert rules(base, ev.UpdateQuota(command_id="x", quota=shrink)) == {"min-sum"}
    # a key in the children's sum that the bound lacks is a violation
    missing = eq("org", is_parent=True, min={"cpu": "8"})
    assert rules(base, ev.UpdateQuota(command_id="x", quota=missing)) == {"min-sum"}
    forced = eq("b", parent="org", min={"cpu": "5"}, labels={quota.LABEL_ALLOW_FORCE_UPDATE: "true"})
    create(base, forced)


def test_all_violations_at_once() -> None:
    bad = eq("x", parent="nope", min={"cpu": "-1", "gpu": "2"}, max={"cpu": "1"})
    assert rules(QuotaTreeState(), ev.CreateQuota(command_id="x", quota=bad)) == {
        "non-negative",
        "min-keys-in-max",
        "parent-exists",
    }


def test_cycle_direct_and_through_chain() -> None:
    s = create(QuotaTreeState(), eq("a", is_parent=True))
    s = create(s, eq("b", parent="a", is_parent=True))
    s = create(s, eq("c", parent="b", is_parent=True))
    self_loop = eq("a", parent="a", is_parent=True)
    assert "no-cycle" in rules(s, ev.UpdateQuota(command_id="x", quota=self_loop))
    with pytest.raises(Rejected) as info:
        decide(
            s,
            ev.UpdateQuota(command_id="y", quota=eq("a", parent="c", is_parent=True)),
            now=NOW,
            actor="u",
            pods_by_quota={},
        )
    cyc = [v for v in info.value.violations if v.rule == "no-cycle"]
    assert cyc and "a -> c -> b -> a" in cyc[0].message
    assert validation.find_cycle(s.specs(), "c") is None


def test_lending_borrowing_limits_and_fair_sharing() -> None:
    good = {
        validation.ANNOTATION_LENDING_LIMIT: '{"cpu": "2"}',
        validation.ANNOTATION_BORROWING_LIMIT: '{"cpu": "1"}',
        validation.ANNOTATION_FAIR_SHARING: "false",
    }
    create(QuotaTreeState(), eq("a", max={"cpu": "4"}, annotations=good))
    bad = {
        validation.ANNOTATION_LENDING_LIMIT: '{"gpu": "2"}',
        validation.ANNOTATION_BORROWING_LIMIT: '{"cpu": "-1"}',
        validation.ANNOTATION_FAIR_SHARING: "maybe",
    }
    assert rules(
        QuotaTreeState(), ev.CreateQuota(command_id="x", quota=eq("a", max={"cpu": "4"}, annotations=bad))
    ) == {
        "limit-keys-in-max",
        "non-negative",
        "annotation-format",
    }


def test_bad_quantity_is_a_violation_not_a_crash() -> None:
    assert rules(QuotaTreeState(), ev.CreateQuota(command_id="x", quota=eq("a", max={"cpu": "lots"}))) == {"format"}


def test_unchanged_root_update_is_accepted_with_top_level_children() -> None:
    s = create(QuotaTreeState(), eq("a", min={"cpu": "4"}))
    root = s.quotas[quota.ROOT_QUOTA]
    run(s, ev.UpdateQuota(command_id="x", quota=root))


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (eq("a/b"), "metadata.name"),
        (eq("q" * 100_000), "metadata.name"),
        (eq("team", tree="t" * 5000), f"metadata.labels[{quota.LABEL_TREE_ID}]"),
        (eq("team", parent="Not/A-Quota"), f"metadata.labels[{quota.LABEL_PARENT}]"),
        (eq("team", annotations={quota.ANNOTATION_NAMESPACES: '["ok", "Not_OK"]'}), "namespaces"),
    ],
)
def test_names_kubernetes_refuses_are_name_format_violations_before_anything_else(
    obj: quota.ElasticQuota, field: str
) -> None:
    with pytest.raises(Rejected) as info:
        decide(QuotaTreeState(), ev.CreateQuota(command_id="c", quota=obj), now=NOW, actor="alice", pods_by_quota={})
    assert [(v.field, v.rule) for v in info.value.violations] == [(field, "name-format")]
    assert len(str(info.value)) < 500  # a long name is quoted shortened


def test_an_import_with_one_bad_name_is_refused_whole() -> None:
    command = ev.ImportQuotas(command_id="i", quotas=(eq("fine"), eq("caf\u00e9")))
    assert rules(QuotaTreeState(), command) == {"name-format"}

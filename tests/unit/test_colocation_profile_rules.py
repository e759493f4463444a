"""The REST API's ClusterColocationProfiles, pure (issue 24 point 1): what services.webhook.profiles keeps and what it
refuses (each refusal naming its field), how a kept one reads back and is merge-patched, and how the webhook's view
(services.webhook.state) folds the profile log's events with the cluster's, the log's winning for a shared name."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.cluster import ColocationProfile, ColocationProfileObserved, ProfileMeta
from schemas.colocation_events import PROFILE_EVENT_DECODER, ColocationProfileDeleted, ColocationProfileSet
from schemas.names import InvalidName, qualified_name
from services.common.mergepatch import merge_patch
from services.webhook import colocation, profiles
from services.webhook.state import AdmissionView

BATCH: dict[str, Any] = {
    "apiVersion": "config.koordinator.sh/v1alpha1",
    "kind": "ClusterColocationProfile",
    "metadata": {
        "name": "colocation-batch-jobs",
        "uid": "3f6c1d2e-0000-4000-8000-000000000001",
        "resourceVersion": "12",
        "generation": 3,
        "creationTimestamp": "2026-11-01T10:00:00Z",
        "managedFields": [{"manager": "kubectl"}],
        "labels": {"team": "platform"},
        "annotations": {profiles.LAST_APPLIED: "{...}", "owner": "sre"},
    },
    "spec": {
        "namespaceSelector": {"matchLabels": {"koordinator.sh/enable-colocation": "true"}},
        "selector": {"matchExpressions": [{"key": "job-name", "operator": "Exists"}]},
        "qosClass": "BE",
        "priorityClassName": "koord-batch",
        "koordinatorPriority": 1111,
        "schedulerName": "koord-scheduler",
        "probability": "50%",
        "labels": {"koordinator.sh/mutated": "true"},
        "annotations": {"example.com/why": "batch jobs run as BE"},
        "labelKeysMapping": {"job-name": "example.com/job"},
        "annotationKeysMapping": {"a": "example.com/b"},
        "labelSuffixes": {"tier": "-be"},
        "patch": {"spec": {"containers": [{"name": "main", "env": [{"name": "BATCH", "value": "1"}]}]}},
    },
    "status": {},
}


def with_spec(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": spec}


def test_a_kubectl_printed_profile_is_kept_without_the_server_fields() -> None:
    profile, version = profiles.clean(copy.deepcopy(BATCH))
    assert version == "12"
    assert profile.metadata == ProfileMeta(
        name="colocation-batch-jobs", labels={"team": "platform"}, annotations={"owner": "sre"}
    )
    assert profile.spec == BATCH["spec"]
    rendered = profiles.render(profile, resource_version=7)
    assert rendered["metadata"] == {
        "name": "colocation-batch-jobs",
        "resourceVersion": "7",
        "labels": {"team": "platform"},
        "annotations": {"owner": "sre"},
    }
    assert (rendered["apiVersion"], rendered["kind"], rendered["spec"]) == (
        profiles.API_VERSION,
        profiles.KIND,
        BATCH["spec"],
    )
    assert profiles.clean(rendered) == (profile, "7")  # what it reads back is what it takes


def test_the_minimal_profile_and_the_path_name() -> None:
    profile, version = profiles.clean({"spec": {"qosClass": "LS"}}, name="ls-everything")
    assert (profile.metadata.name, profile.spec, version) == ("ls-everything", {"qosClass": "LS"}, "")
    assert profiles.clean({"metadata": {"name": "x"}})[0].spec == {}  # an empty spec: every Pod, no change


REFUSED = [
    # (document, name from the path, field, words of the message)
    ([BATCH], "", "body", "got an array"),
    ({**BATCH, "kind": "ElasticQuota"}, "", "kind", "must be ClusterColocationProfile"),
    ({**BATCH, "apiVersion": "v1"}, "", "apiVersion", "config.koordinator.sh/v1alpha1"),
    ({**BATCH, "sepc": {}}, "", "sepc", "unknown field"),
    ({"spec": {}}, "", "metadata.name", "required"),
    ({"metadata": {"name": "Batch_Jobs"}}, "", "metadata.name", "DNS-1123 subdomain"),
    ({"metadata": {"name": "a" * 254}}, "", "metadata.name", "254 characters long; at most 253"),
    ({"metadata": {"name": "a"}}, "b", "metadata.name", "the body names profile 'a' but the path 'b'"),
    ({"metadata": {"name": "p", "namespace": "default"}}, "", "metadata.namespace", "cluster-scoped"),
    ({"metadata": {"name": "p", "labels": {"a": 1}}}, "", "metadata.labels.a", "must be a string"),
    ({"metadata": {"name": "p", "annotations": {"no good/x/y": "1"}}}, "", "metadata.annotations key", "qualified"),
    ({"metadata": {"name": "p", "resourceVersion": ["1"]}}, "", "metadata.resourceVersion", "must be a string"),
    ({"metadata": {"name": "p"}, "spec": []}, "", "spec", "must be an object"),
    (with_spec(qosclass="BE"), "", "spec.qosclass", "unknown field"),
    (with_spec(qosClass="BestEffort"), "", "spec.qosClass", "one of LSE, LSR, LS, BE, SYSTEM"),
    (with_spec(qosClass=1), "", "spec.qosClass", "got 1"),
    (with_spec(probability="50"), "", "spec.probability", "not a percentage"),
    (with_spec(probability="x%"), "", "spec.probability", "not a percentage"),
    (with_spec(probability=101), "", "spec.probability", "from 0 to 100"),
    (with_spec(probability="-1%"), "", "spec.probability", "from 0 to 100"),
    (with_spec(probability=True), "", "spec.probability", "integer or a percentage"),
    (with_spec(probability="9" * 10_000 + "%"), "", "spec.probability", "(10001 characters)"),
    (with_spec(probability=0.5), "", "spec.probability", "integer or a percentage"),
    (with_spec(koordinatorPriority=2**31), "", "spec.koordinatorPriority", "32-bit integer, got 2147483648"),
    (with_spec(koordinatorPriority="5"), "", "spec.koordinatorPriority", "32-bit integer"),
    (with_spec(selector={"matchExpressions": [{"key": "a", "operator": "Has"}]}), "", "spec.selector", "'Has'"),
    (with_spec(selector={"matchExpressions": [{"key": "a", "operator": "In"}]}), "", "spec.selector", "needs values"),
    (
        with_spec(namespaceSelector={"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
        "",
        "spec.namespaceSelector",
        "takes no values",
    ),
    (with_spec(selector={"matchLabels": {"bad key!": "x"}}), "", "spec.selector", "invalid label"),
    (with_spec(selector={"matchLabels": {"a": 1}}), "", "spec.selector.matchLabels.a", "must be a string"),
    (
        with_spec(selector={"matchExpressions": [{"key": "a", "operator": 1}]}),
        "",
        "spec.selector.matchExpressions[0].operator",
        "Expected `str`",
    ),
    (with_spec(selector={"matchLabel": {"a": "b"}}), "", "spec.selector.matchLabel", "unknown field"),
    (
        with_spec(selector={"matchExpressions": [{"key": "a", "operator": "Exists", "valeus": []}]}),
        "",
        "spec.selector.matchExpressions[0].valeus",
        "unknown field",
    ),
    (with_spec(selector="app=web"), "", "spec.selector", "must be an object"),
    (with_spec(labels={"a": "not a label value"}), "", "spec.labels.a", "label value"),
    (with_spec(labels={"-a": "b"}), "", "spec.labels key", "qualified name"),
    (with_spec(labels={"a": 1}), "", "spec.labels.a", "must be a string"),
    (with_spec(annotations={"a b": "c"}), "", "spec.annotations key", "qualified name"),
    (with_spec(labelKeysMapping={"a": "b c"}), "", "spec.labelKeysMapping.a", "qualified name"),
    (with_spec(annotationKeysMapping={"a": "/b"}), "", "spec.annotationKeysMapping.a", "qualified name"),
    (with_spec(labelSuffixes={"tier": " be"}), "", "spec.labelSuffixes.tier", "letters, digits"),
    (with_spec(schedulerName="Koord Scheduler"), "", "spec.schedulerName", "DNS-1123 subdomain"),
    (with_spec(priorityClassName="x" * 300), "", "spec.priorityClassName", "300 characters long"),
    (with_spec(priorityClassName=5), "", "spec.priorityClassName", "must be a string"),
    (with_spec(patch="not json"), "", "spec.patch", "the patch is not JSON"),
    (with_spec(patch=[1]), "", "spec.patch", "must be a JSON object"),
    (with_spec(patch={"metadata": {"x": [float("inf")]}}), "", "spec.patch", "out of range (inf)"),
    (with_spec(patch={"spec": {"containers": [{"image": "x"}]}}), "", "spec.patch", "lacks its merge key 'name'"),
    (with_spec(patch={"spec": {"containers": "x"}}), "", "spec.patch", "does not leave a valid Pod"),
    (with_spec(patch={"$patch": "delete"}), "", "spec.patch", "unsupported $patch directive"),
]


@pytest.mark.parametrize(("document", "name", "field", "words"), REFUSED)
def test_each_bad_profile_is_refused_naming_its_field(document: Any, name: str, field: str, words: str) -> None:
    with pytest.raises(profiles.Invalid) as refused:
        profiles.clean(document, name=name)
    assert refused.value.field == field, refused.value
    assert words in refused.value.message, refused.value
    assert refused.value.status == (400 if field == "body" else 422)
    assert str(refused.value).startswith(f"{field}: ")


def test_a_huge_key_or_name_is_shown_shortened() -> None:
    key = "k" * 100_000
    with pytest.raises(profiles.Invalid) as refused:
        profiles.clean(with_spec(labels={key: "v"}))
    assert len(str(refused.value)) < 400
    with pytest.raises(profiles.Invalid) as refused:
        profiles.clean({"metadata": {"name": "p"}, "spec": {key: 1}})
    assert refused.value.field.startswith("spec[") and len(refused.value.field) < 80


def test_the_webhook_refuses_a_huge_probability_as_the_profiles_fault() -> None:
    with pytest.raises(colocation.ProfileError, match="10001 characters"):
        colocation.probability_percent("9" * 10_000 + "%")


def test_a_profile_over_the_size_bound_is_a_413() -> None:
    big = {f"example.com/a{i}": "x" * 1000 for i in range(300)}
    with pytest.raises(profiles.Invalid) as refused:
        profiles.clean(with_spec(annotations=big))
    assert refused.value.status == 413 and f"at most {profiles.MAX_PROFILE_BYTES}" in refused.value.message


def test_what_the_rules_keep_the_webhook_applies_without_an_error() -> None:
    """The rules are the webhook's: a kept profile mutates a matching Pod without a ProfileError."""
    profile, _ = profiles.clean(copy.deepcopy(BATCH))
    pod = {
        "metadata": {"name": "pi-x", "namespace": "spark", "labels": {"job-name": "pi", "tier": "x"}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
    }
    mutated, changed = colocation.mutate_pod(
        pod,
        [msgspec.to_builtins(profile)],
        namespace_labels={"koordinator.sh/enable-colocation": "true"},
        priority_classes={"koord-batch": colocation.PriorityClass(value=5999)},
        skip_mutating_resources=False,
        draw=lambda: 0,
    )
    assert changed and mutated["metadata"]["labels"]["tier"] == "x-be"
    assert mutated["metadata"]["labels"]["example.com/job"] == "pi"
    assert mutated["spec"]["containers"][0]["env"] == [{"name": "BATCH", "value": "1"}]
    assert mutated["spec"]["containers"][0]["resources"]["requests"] == {
        "kubernetes.io/batch-cpu": "1000",
        "kubernetes.io/batch-memory": "1Gi",
    }


def test_a_merge_patch_changes_what_it_names_and_null_removes() -> None:
    profile, _ = profiles.clean(copy.deepcopy(BATCH))
    document, version = profiles.patched(
        profile, {"metadata": {"resourceVersion": "9"}, "spec": {"probability": 100, "patch": None}}
    )
    assert version == "9"
    changed, _ = profiles.clean(document, name="colocation-batch-jobs")
    assert changed.spec["probability"] == 100 and "patch" not in changed.spec
    assert changed.spec["qosClass"] == "BE" and changed.metadata == profile.metadata
    bad, _ = profiles.patched(profile, {"spec": {"qosClass": "XL"}})
    with pytest.raises(profiles.Invalid, match=r"spec\.qosClass"):
        profiles.clean(bad, name="colocation-batch-jobs")
    with pytest.raises(profiles.Invalid, match="body: a merge patch must be an object") as refused:
        profiles.patched(profile, [1])
    assert refused.value.status == 400
    renamed, _ = profiles.patched(profile, {"metadata": {"name": "other"}})
    with pytest.raises(profiles.Invalid, match="but the path"):
        profiles.clean(renamed, name="colocation-batch-jobs")


_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
_any = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_fields = st.sampled_from(sorted(profiles._SPEC))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_fields, _any, max_size=4), _any)
def test_any_spec_is_kept_or_refused_naming_a_field_never_an_exception(spec: dict[str, Any], metadata: Any) -> None:
    for document in ({"metadata": {"name": "p"}, "spec": spec}, {"metadata": metadata, "spec": spec}):
        try:
            profile, _ = profiles.clean(document)
        except profiles.Invalid as refused:
            assert refused.field and refused.status in (400, 413, 422)
            continue
        # kept: it round-trips through the event and the webhook can apply it to a Pod
        event = ColocationProfileSet(name=profile.metadata.name, profile=profile, actor="a", time=1.0)
        assert PROFILE_EVENT_DECODER.decode(msgspec.json.encode(event)) == event


def test_merge_patch_is_rfc_7386() -> None:
    assert merge_patch({"a": "b", "c": {"d": "e", "f": "g"}}, {"a": "z", "c": {"f": None}}) == {
        "a": "z",
        "c": {"d": "e"},
    }
    assert merge_patch({"a": [1]}, {"a": [2, 3]}) == {"a": [2, 3]}
    assert merge_patch({"a": 1}, ["x"]) == ["x"]
    assert merge_patch("x", {"a": {"b": None}}) == {"a": {}}


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("app", True),
        ("koordinator.sh/qosClass", True),
        ("a.b-c_d", True),
        ("example.com/", False),
        ("/a", False),
        ("Example.com/a", False),
        ("a/b/c", False),
        ("-a", False),
        ("a" * 63, True),
        ("a" * 64, False),
        ("x" * 253 + "/a", True),
        ("x" * 254 + "/a", False),
        ("", False),
    ],
)
def test_qualified_names_are_kubernetes_label_keys(key: str, ok: bool) -> None:
    if ok:
        assert qualified_name(key) == key
    else:
        with pytest.raises(InvalidName):
            qualified_name(key)


# --- the webhook's view: the log's profiles with the cluster's


def observed(name: str, deleted: bool = False, **spec: Any) -> ColocationProfileObserved:
    profile = None if deleted else ColocationProfile(metadata=ProfileMeta(name=name), spec=spec)
    return ColocationProfileObserved(name=name, observed_at=1.0, deleted=deleted, profile=profile)


def owned(name: str, **spec: Any) -> ColocationProfileSet:
    profile = ColocationProfile(metadata=ProfileMeta(name=name), spec=spec)
    return ColocationProfileSet(name=name, profile=profile, actor="admin", time=2.0)


def specs(view: AdmissionView) -> list[tuple[str, Any]]:
    return [(p["metadata"]["name"], p["spec"]) for p in view.profiles]


def test_the_logs_profile_wins_over_the_clusters_of_the_same_name_until_it_is_deleted() -> None:
    view = AdmissionView()
    view.apply(observed("b-shared", qosClass="LS"))
    view.apply(observed("c-cluster", qosClass="LSR"))
    view.apply(owned("a-api", qosClass="BE"))
    view.apply(owned("b-shared", qosClass="BE"))
    assert specs(view) == [
        ("a-api", {"qosClass": "BE"}),
        ("b-shared", {"qosClass": "BE"}),
        ("c-cluster", {"qosClass": "LSR"}),
    ]
    assert view.shadowed() == ["b-shared"]
    assert view.counts()["clustercolocationprofile"] == 3
    assert view.counts()["clustercolocationprofile-koordbus"] == 2
    assert view.counts()["clustercolocationprofile-shadowed"] == 1
    view.apply(observed("b-shared", qosClass="SYSTEM"))  # the cluster's changes: the log's still applies
    assert ("b-shared", {"qosClass": "BE"}) in specs(view)
    view.apply(ColocationProfileDeleted(name="b-shared", actor="admin", time=3.0))
    assert ("b-shared", {"qosClass": "SYSTEM"}) in specs(view) and view.shadowed() == []
    view.apply(ColocationProfileDeleted(name="a-api", actor="admin", time=3.0))
    view.apply(observed("c-cluster", deleted=True))
    assert specs(view) == [("b-shared", {"qosClass": "SYSTEM"})]


def test_the_mirrors_copy_in_the_cluster_is_not_applied_the_logs_profile_is() -> None:
    """With the profile mirror on, the bridge publishes the copy it wrote: the webhook applies the log's profile, and
    a copy left behind after the log's was deleted (before the mirror removed it) applies nothing."""
    view = AdmissionView()
    view.apply(owned("p", qosClass="BE"))
    meta = ProfileMeta(name="p", labels={"app.kubernetes.io/managed-by": "koordbus"})
    copy_ = ColocationProfileObserved(
        name="p", observed_at=1.0, profile=ColocationProfile(metadata=meta, spec={"qosClass": "BE"})
    )
    view.apply(copy_)
    assert specs(view) == [("p", {"qosClass": "BE"})] and view.shadowed() == []
    view.apply(ColocationProfileDeleted(name="p", actor="admin", time=3.0))
    assert specs(view) == []
    view.apply(observed("p", qosClass="LS"))  # the cluster's own (the copy replaced by someone's object)
    assert specs(view) == [("p", {"qosClass": "LS"})]

"""ClusterColocationProfile mutation (services.webhook.colocation, spec §10) and `koordbus calc colocation-profile`:
matching, probability, every mutation in its order, the strategic merge patch, the resource translation, refusals."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from koordbus import calc
from services.webhook import colocation

BATCH_PC = {"koord-batch": colocation.PriorityClass(value=5999, preemption_policy="Never")}


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    containers = [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "4Gi"}}}]
    return {
        "metadata": {"namespace": "jobs", "name": "p", "labels": labels if labels is not None else {"app": "spark"}},
        "spec": {"containers": containers, **spec},
    }


def profile(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": {"app": "spark"}}, **spec}}


def mutate(the_pod: dict[str, Any], *profiles: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], bool]:
    options: dict[str, Any] = {
        "namespace_labels": {"team": "data"},
        "priority_classes": BATCH_PC,
        "skip_mutating_resources": False,
        "draw": lambda: 50,
    }
    options.update(kw)
    return colocation.mutate(the_pod, list(profiles), **options)


def test_no_matching_profile_leaves_the_pod_untouched_even_its_resources() -> None:
    out, mutated = mutate(pod({"app": "web"}, priority=5999), profile(labels={"x": "y"}))
    assert not mutated and out["spec"]["containers"][0]["resources"]["requests"] == {"cpu": 1000, "memory": 4 << 30}


@pytest.mark.parametrize(
    ("namespace_selector", "namespace_labels", "matches"),
    [
        ({"matchLabels": {"team": "data"}}, {"team": "data"}, True),
        ({"matchLabels": {"team": "web"}}, {"team": "data"}, False),
        ({"matchLabels": {"team": "web"}}, None, True),  # the Namespace cannot be read: counted as a match
        ({"matchExpressions": [{"key": "team", "operator": "Bogus"}]}, {"team": "data"}, True),  # invalid selector
        ({}, {"team": "data"}, True),
    ],
)
def test_a_failed_selector_evaluation_counts_as_a_match(
    namespace_selector: dict[str, Any], namespace_labels: dict[str, str] | None, matches: bool
) -> None:
    out, mutated = mutate(
        pod(), profile(namespaceSelector=namespace_selector, labels={"hit": "1"}), namespace_labels=namespace_labels
    )
    assert ("hit" in out["metadata"]["labels"]) is matches and mutated is matches


def test_profiles_apply_in_name_order_and_a_later_one_wins() -> None:
    out, _ = mutate(pod(), profile("b", schedulerName="second"), profile("a", schedulerName="first"))
    assert out["spec"]["schedulerName"] == "second"


@pytest.mark.parametrize(
    ("probability", "draw", "applied"),
    [
        (None, 99, True),
        (100, 99, True),
        (0, 0, False),
        (50, 50, True),
        (50, 51, False),
        ("30%", 30, True),
        ("30%", 31, False),
    ],
)
def test_the_probability_draw_skips_only_when_the_draw_is_above_the_percent(
    probability: Any, draw: int, applied: bool
) -> None:
    out, _ = mutate(pod(), profile(probability=probability, labels={"hit": "1"}), draw=lambda: draw)
    assert ("hit" in out["metadata"]["labels"]) is applied


@pytest.mark.parametrize("probability", ["30", "x%", True, 1.5])
def test_an_invalid_probability_is_refused(probability: Any) -> None:
    with pytest.raises(colocation.ProfileError):
        mutate(pod(), profile(probability=probability))


def test_every_mutation_in_its_order() -> None:
    the_pod = pod({"app": "spark", "tier": "gold"})
    the_pod["metadata"]["annotations"] = {"old": "v"}
    out, mutated = mutate(
        the_pod,
        profile(
            labels={"added": "1"},
            annotations={"note": "n"},
            labelKeysMapping={"tier": "copied", "absent": "empty"},
            annotationKeysMapping={"old": "new"},
            labelSuffixes={"copied": "-x", "nope": "-y"},
            schedulerName="koord-scheduler",
            qosClass="BE",
            priorityClassName="koord-batch",
            koordinatorPriority=1111,
        ),
    )
    labels = out["metadata"]["labels"]
    assert mutated
    assert labels["added"] == "1" and labels["copied"] == "gold-x" and labels["empty"] == "" and "nope" not in labels
    assert out["metadata"]["annotations"] == {"old": "v", "note": "n", "new": "v"}
    assert labels["koordinator.sh/qosClass"] == "BE" and labels["koordinator.sh/priority"] == "1111"
    assert out["spec"]["schedulerName"] == "koord-scheduler"
    assert (out["spec"]["priorityClassName"], out["spec"]["priority"], out["spec"]["preemptionPolicy"]) == (
        "koord-batch",
        5999,
        "Never",
    )


def test_an_unknown_priority_class_is_refused_and_an_unset_preemption_policy_is_removed() -> None:
    with pytest.raises(colocation.ProfileError, match="not found"):
        mutate(pod(), profile(priorityClassName="koord-missing"))
    classes = {"koord-prod": colocation.PriorityClass(value=9000)}
    out, _ = mutate(pod(preemptionPolicy="Never"), profile(priorityClassName="koord-prod"), priority_classes=classes)
    assert "preemptionPolicy" not in out["spec"] and out["spec"]["priority"] == 9000


def test_the_patch_merges_strategically() -> None:
    the_pod = pod()
    the_pod["spec"]["containers"].append({"name": "side", "image": "s:1", "env": [{"name": "A", "value": "1"}]})
    the_pod["spec"]["tolerations"] = [{"key": "a"}]
    patch = {
        "metadata": {"labels": {"app": None, "patched": "yes"}},
        "spec": {
            "containers": [
                {"name": "side", "image": "s:2", "env": [{"name": "B", "value": "2"}]},
                {"name": "c", "$patch": "delete"},
                {"name": "new", "image": "n:1"},
            ],
            "tolerations": [{"key": "b"}],
        },
    }
    out, _ = mutate(the_pod, profile(patch=json.dumps(patch)))
    assert out["metadata"]["labels"] == {"patched": "yes"}
    containers = {c["name"]: c for c in out["spec"]["containers"]}
    assert list(containers) == ["side", "new"]
    assert containers["side"]["image"] == "s:2" and [e["name"] for e in containers["side"]["env"]] == ["A", "B"]
    assert out["spec"]["tolerations"] == [{"key": "b"}]  # no merge key: replaced


@pytest.mark.parametrize("patch", [["not", "an", "object"], "{not json", {"spec": {"containers": "x"}}])
def test_a_patch_that_cannot_be_applied_is_refused(patch: Any) -> None:
    with pytest.raises(colocation.ProfileError):
        mutate(pod(), profile(patch=patch))


def resources(out: dict[str, Any], index: int = 0, list_name: str = "containers") -> dict[str, Any]:
    return dict(out["spec"][list_name][index]["resources"])


def test_a_batch_pod_gets_batch_resources_and_a_limit_without_request_gets_one() -> None:
    the_pod = pod(priority=5999, overhead={"cpu": "250m", "memory": "64Mi"})
    the_pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1.5001", "memory": "1Gi"}}
    the_pod["spec"]["initContainers"] = [
        {"name": "i", "resources": {"requests": {"cpu": "500m"}, "limits": {"kubernetes.io/batch-cpu": "9"}}}
    ]
    out, mutated = mutate(the_pod, profile(probability=0))
    assert mutated  # skipped by probability, still matched: the translation runs
    assert resources(out) == {
        "limits": {"kubernetes.io/batch-cpu": 1501, "kubernetes.io/batch-memory": 1 << 30},  # milli rounded up
        "requests": {"kubernetes.io/batch-cpu": 1501, "kubernetes.io/batch-memory": 1 << 30},
    }
    assert resources(out, list_name="initContainers") == {
        "requests": {"kubernetes.io/batch-cpu": 500},
        "limits": {"kubernetes.io/batch-cpu": 9},
    }
    assert out["spec"]["overhead"] == {"kubernetes.io/batch-cpu": 250, "kubernetes.io/batch-memory": 64 << 20}


def test_mid_pods_get_mid_resources_and_prod_pods_keep_theirs() -> None:
    mid, _ = mutate(pod({"app": "spark", "koordinator.sh/priority-class": "koord-mid"}), profile())
    assert resources(mid)["requests"] == {"kubernetes.io/mid-cpu": 1000, "kubernetes.io/mid-memory": 4 << 30}
    prod, mutated = mutate(pod(priority=9500), profile())
    assert resources(prod)["requests"] == {"cpu": 1000, "memory": 4 << 30} and mutated is True  # applied, untranslated


def test_the_skip_annotation_or_the_gate_keeps_the_native_resources() -> None:
    skipping = profile(qosClass="BE")
    skipping["metadata"]["annotations"] = {colocation.SKIP_UPDATE_RESOURCES: ""}
    out, _ = mutate(pod(priority=5999), skipping)
    assert resources(out)["requests"] == {"cpu": 1000, "memory": 4 << 30}
    out, _ = mutate(pod(priority=5999), profile(), skip_mutating_resources=True)
    assert resources(out)["requests"] == {"cpu": 1000, "memory": 4 << 30}


def test_the_input_pod_is_not_changed() -> None:
    the_pod = pod(priority=5999)
    before = copy.deepcopy(the_pod)
    mutate(the_pod, profile(labels={"a": "b"}, patch={"metadata": {"labels": {"c": "d"}}}))
    assert the_pod == before


def run(document: dict[str, Any]) -> calc.Outcome:
    return calc.calculate("colocation-profile", json.dumps(document))


def test_the_calc_kind_refuses_in_its_output_and_exits_2_on_malformed_input() -> None:
    ok = run({"pod": pod(), "profiles": [profile(qosClass="BE")], "namespace": {"metadata": {"name": "jobs"}}})
    assert ok.exit_code == 0 and json.loads(ok.stdout)["mutated"] is True
    refused = run({"pod": pod(), "profiles": [profile(priorityClassName="missing")], "randomDraw": 1})
    assert refused.exit_code == 0 and "not found" in json.loads(refused.stdout)["error"]
    update = run({"operation": "UPDATE", "pod": pod(), "profiles": [profile(labels={"a": "b"})]})
    assert json.loads(update.stdout) == {
        "pod": json.loads(json.dumps(mutate(pod(), draw=lambda: 0)[0])),
        "mutated": False,
    }
    assert run({"profiles": []}).exit_code == 2
    bad = pod()
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "one"
    assert run({"pod": bad, "profiles": [profile()]}).exit_code == 2
    assert run({"pod": pod(), "randomDraw": 100}).exit_code == 2

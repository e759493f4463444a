"""The ElasticQuota validation's pure half (services.webhook.elasticquota): which AdmissionReview becomes which quota
command, by whom, and what each reply of the quota service becomes; and its I/O half (QuotaValidation) against a
scripted quota service: a lost race asked again, a quota service that does not answer refused with the reason.

The commands are decided here by the quota service's own core (services.quota.core.decide), so a kubectl change meets
the same §3.9 rules and cycle check as a REST one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.errors import BusUnavailableError, RemoteError
from schemas import quota
from schemas import quota_events as ev
from schemas.quota_service import CommandReply, CommandRequest
from services.common.metrics import new_registry, render
from services.quota import core
from services.webhook import admission, elasticquota
from services.webhook.service import QUOTA_CONFLICT_ATTEMPTS, QuotaValidation
from tests.support.webhook import MIRROR_USER, admission_review, elastic_quota

NOW = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
MIRROR = frozenset({MIRROR_USER})
WRITE_BACK = {quota.ANNOTATION_RUNTIME: '{"cpu":"6"}', quota.ANNOTATION_REQUEST: '{"cpu":"7"}'}


def request_of(review: dict[str, Any]) -> admission.AdmissionRequest:
    return admission.review_request(review)


def planned(review: dict[str, Any]) -> elasticquota.Answer | elasticquota.Ask:
    return elasticquota.plan(request_of(review), mirror_users=MIRROR)


def asked(review: dict[str, Any]) -> CommandRequest:
    plan = planned(review)
    assert isinstance(plan, elasticquota.Ask), plan
    return plan.request


def stored(name: str, **fields: Any) -> dict[str, Any]:
    """The object as the mirror wrote it: koordbus's labels and shared-weight, the write-back annotations, used."""
    obj = elastic_quota(name, stored=True, **fields)
    obj["metadata"].setdefault("annotations", {}).update(WRITE_BACK)
    obj["status"] = {"used": {"cpu": "3"}}
    return obj


# --- which review becomes which command


def test_a_create_is_the_rest_apis_create_command_by_that_user() -> None:
    obj = stored("team-a", labels={quota.LABEL_PARENT: "org"}, annotations={"team": "a"})
    review = admission_review("elasticquotas", obj, namespace_name="teams", user="alice", dry_run=True)
    request = asked(review)
    assert request.actor == "kubernetes/alice" and request.dry_run is True
    assert isinstance(request.command, ev.CreateQuota)
    assert request.command.command_id == f"admission-{review['request']['uid']}"
    sent = request.command.quota
    assert (sent.metadata.name, sent.metadata.namespace) == ("team-a", "teams")
    assert (sent.metadata.uid, sent.metadata.resource_version, sent.status) == ("", "", quota.ElasticQuotaStatus())
    assert sent.metadata.labels == {quota.LABEL_PARENT: "org"}
    assert sent.metadata.annotations == {"team": "a"}  # neither the write-back figures nor kubectl's last-applied
    assert sent.spec == quota.ElasticQuotaSpec(min={"cpu": "4"}, max={"cpu": "8"})


def test_an_update_is_a_merge_patch_of_what_the_user_changed() -> None:
    old = stored("team-a", labels={quota.LABEL_PARENT: "org", "x": "1"}, annotations={"gone": "soon"})
    new = stored("team-a", labels={quota.LABEL_PARENT: "org", "y": "2"}, max={"cpu": "12", "memory": "8Gi"})
    new["status"] = {"used": {"cpu": "5"}}  # the write-back figures and status are koord-scheduler's, not a change
    new["metadata"]["annotations"][quota.ANNOTATION_RUNTIME] = '{"cpu":"9"}'
    new["metadata"]["resourceVersion"] = "4712"
    review = admission_review("elasticquotas", new, operation="UPDATE", old=old, namespace_name="teams", name="team-a")
    request = asked({**review, "request": {**review["request"], "userInfo": {"username": "argocd"}}})
    assert request.actor == "kubernetes/argocd"
    assert request.command == ev.PatchQuota(
        command_id=f"admission-{review['request']['uid']}",
        name="team-a",
        patch={
            "metadata": {"labels": {"x": None, "y": "2"}, "annotations": {"gone": None}},
            "spec": {"max": {"cpu": "12", "memory": "8Gi"}},
        },
    )


def test_an_update_that_changes_nothing_the_log_holds_asks_nothing() -> None:
    old = stored("team-a")
    new = stored("team-a")
    new["status"] = {"used": {"cpu": "7"}}
    new["metadata"]["annotations"] = {**new["metadata"]["annotations"], quota.ANNOTATION_REQUEST: '{"cpu":"9"}'}
    new["metadata"]["finalizers"] = ["example.com/keep"]
    review = admission_review("elasticquotas", new, operation="UPDATE", old=old, namespace_name="teams")
    plan = planned(review)
    assert isinstance(plan, elasticquota.Answer) and plan.decision == "unchanged"
    assert plan.response == admission.AdmissionResponse(uid=review["request"]["uid"], allowed=True)


def test_a_delete_names_the_quota() -> None:
    review = admission_review(
        "elasticquotas", None, operation="DELETE", old=stored("team-a"), namespace_name="teams", name="team-a"
    )
    request = asked(review)
    assert request.command == ev.DeleteQuota(command_id=f"admission-{review['request']['uid']}", name="team-a")
    unnamed = admission_review("elasticquotas", None, operation="DELETE", old=stored("team-b"), namespace_name="t")
    assert asked(unnamed).command == ev.DeleteQuota(command_id=f"admission-{unnamed['request']['uid']}", name="team-b")


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_the_mirrors_own_writes_pass_without_a_command(operation: str) -> None:
    obj = None if operation == "DELETE" else stored("team-a", max={"cpu": "99"})
    old = None if operation == "CREATE" else stored("team-a")
    review = admission_review(
        "elasticquotas", obj, operation=operation, old=old, namespace_name="teams", name="team-a", user=MIRROR_USER
    )
    plan = planned(review)
    assert isinstance(plan, elasticquota.Answer) and plan.decision == "mirror" and plan.response.allowed
    # the same write by anyone else is a command: the name is the user kube-apiserver authenticated, not a label
    assert isinstance(elasticquota.plan(request_of(review), mirror_users=frozenset()), elasticquota.Ask)


def test_other_resources_subresources_and_connect_are_ignored() -> None:
    for review in (
        admission_review("configmaps", {"metadata": {"name": "x"}}),
        admission_review("elasticquotas", stored("a"), sub_resource="status", operation="UPDATE", old=stored("a")),
    ):
        plan = planned(review)
        assert isinstance(plan, elasticquota.Answer) and plan.decision == "ignored" and plan.response.allowed


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            {"metadata": {"name": "a"}, "spec": {"max": "lots"}},
            "request.object.spec.max: Expected `object | null`, got `str`",
        ),
        ([1], "request.object: expected an ElasticQuota object, got list"),
        (
            {"metadata": {"name": "a", "labels": {"x": 1}}},
            "request.object.metadata.labels[...]: Expected `str`, got `int`",
        ),
    ],
)
def test_an_object_that_does_not_decode_is_refused_naming_the_field(obj: Any, message: str) -> None:
    plan = planned(admission_review("elasticquotas", obj, namespace_name="teams"))
    assert isinstance(plan, elasticquota.Answer) and plan.decision == "invalid"
    assert plan.response.status is not None and plan.response.status.code == 400
    assert plan.response.status.message.startswith(message), plan.response.status.message


_labels = st.dictionaries(st.sampled_from(["a", "b", quota.LABEL_PARENT, quota.LABEL_IS_PARENT]), st.text(max_size=3))
_amounts = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), st.sampled_from(["1", "2", "500m"]))


@st.composite
def quotas(draw: st.DrawFn) -> quota.ElasticQuota:
    return quota.ElasticQuota(
        metadata=msgspec.convert(
            {"name": "q", "labels": draw(_labels), "annotations": draw(_labels)}, quota.kube.ObjectMeta
        ),
        spec=quota.ElasticQuotaSpec(min=draw(st.none() | _amounts), max=draw(st.none() | _amounts)),
    )


@settings(max_examples=300, deadline=None)
@given(quotas(), quotas())
def test_the_patch_turns_the_old_object_into_the_new_one_in_the_quota_model(
    old: quota.ElasticQuota, new: quota.ElasticQuota
) -> None:
    """What the quota service does with the patch (services.quota.core.merge_patch over the log's object) gives the
    new object's labels, annotations and spec; no patch exactly when those are equal."""
    before, after = elasticquota.quota_view(old), elasticquota.quota_view(new)
    patch = elasticquota.merge_diff(before, after)
    patched = msgspec.convert(core.merge_patch(msgspec.to_builtins(old), patch), quota.ElasticQuota)
    assert elasticquota.quota_view(patched) == after
    assert (patch == {}) == (before == after)


# --- the same rules as the REST API, decided by the quota service's core


def decide(state: core.QuotaTreeState, request: CommandRequest) -> CommandReply:
    """What the quota service replies (services.quota.service.execute, without the log)."""
    tree = core.tree_of(state, request.command)
    try:
        events = core.decide(state, request.command, now=NOW, actor=request.actor, pods_by_quota={})
    except core.Rejected as rejected:
        return CommandReply(outcome="rejected", tree=tree, violations=rejected.violations, message=str(rejected))
    assert all(event.actor == request.actor for event in events)
    return CommandReply(outcome="valid" if request.dry_run else "applied", tree=tree, seq=1)


def team() -> core.QuotaTreeState:
    state = core.QuotaTreeState()
    for obj in (
        elastic_quota("org", min={"cpu": "10"}, max={"cpu": "20"}, labels={quota.LABEL_IS_PARENT: "true"}),
        elastic_quota("a", labels={quota.LABEL_PARENT: "org"}),
    ):
        create = asked(admission_review("elasticquotas", obj, namespace_name="teams"))
        (event,) = core.decide(state, create.command, now=NOW, actor=create.actor, pods_by_quota={})
        state = state.apply(event)
    return state


def answered(state: core.QuotaTreeState, review: dict[str, Any]) -> elasticquota.Answer:
    plan = planned(review)
    assert isinstance(plan, elasticquota.Ask)
    return elasticquota.answer(request_of(review), plan, decide(state, plan.request))


def test_a_refusal_lists_every_violation_in_the_message_and_as_causes() -> None:
    state = team()
    bad = elastic_quota(
        "b", min={"cpu": "12", "memory": "-1"}, max={"cpu": "8"}, labels={quota.LABEL_PARENT: "a"}
    )  # min > max, a negative amount, a key of min not in max, a parent that is no parent, the min sum under org
    answer = answered(state, admission_review("elasticquotas", bad, namespace_name="teams", user="alice"))
    status = answer.response.status
    assert answer.decision == "refused" and not answer.response.allowed and status is not None
    assert (status.code, status.reason) == (422, "Invalid")
    causes = status.details.causes if status.details is not None else ()
    assert len(causes) >= 4 and status.message.startswith(f"ElasticQuota teams/b: {len(causes)} violations")
    for cause in causes:
        assert cause.message in status.message and cause.field and cause.reason
    rules = {cause.reason for cause in causes}
    assert {"non-negative", "min-le-max", "parent-is-parent"} <= rules, rules


def test_a_cycle_is_refused_as_by_the_rest_api() -> None:
    state = team()
    old = elastic_quota("org", min={"cpu": "10"}, max={"cpu": "20"}, labels={quota.LABEL_IS_PARENT: "true"})
    new = elastic_quota(
        "org", min={"cpu": "10"}, max={"cpu": "20"}, labels={quota.LABEL_IS_PARENT: "true", quota.LABEL_PARENT: "a"}
    )
    review = admission_review("elasticquotas", new, operation="UPDATE", old=old, namespace_name="teams", name="org")
    answer = answered(state, review)
    assert answer.decision == "refused" and answer.response.status is not None
    assert "cycle" in answer.response.status.message


def test_a_valid_change_is_recorded_a_dry_run_only_validated() -> None:
    state = team()
    old = elastic_quota("a", labels={quota.LABEL_PARENT: "org"})
    new = elastic_quota("a", labels={quota.LABEL_PARENT: "org"}, max={"cpu": "16"})
    for dry_run, decision in ((False, "recorded"), (True, "validated")):
        review = admission_review(
            "elasticquotas", new, operation="UPDATE", old=old, namespace_name="teams", name="a", dry_run=dry_run
        )
        answer = answered(state, review)
        assert (answer.decision, answer.response) == (
            decision,
            admission.AdmissionResponse(uid=review["request"]["uid"], allowed=True),
        )


def test_a_name_that_exists_is_409_and_a_quota_the_log_does_not_hold_passes_with_a_warning() -> None:
    state = team()
    again = answered(state, admission_review("elasticquotas", elastic_quota("a"), namespace_name="teams"))
    assert again.response.status is not None and again.response.status.code == 409
    legacy_old = elastic_quota("legacy", stored=True)
    legacy_new = elastic_quota("legacy", stored=True, max={"cpu": "9"})
    for operation, obj in (("UPDATE", legacy_new), ("DELETE", None)):
        review = admission_review(
            "elasticquotas", obj, operation=operation, old=legacy_old, namespace_name="teams", name="legacy"
        )
        answer = answered(state, review)
        assert answer.decision == "unmanaged" and answer.response.allowed
        assert "not in koordbus's quota log" in answer.response.warnings[0]
    root = answered(
        state,
        admission_review(
            "elasticquotas", None, operation="DELETE", old=elastic_quota(quota.ROOT_QUOTA), name=quota.ROOT_QUOTA
        ),
    )
    assert root.decision == "refused" and root.response.status is not None
    assert "koordinator-root-quota cannot be deleted" in root.response.status.message


def test_the_answer_is_an_admission_review_kube_apiserver_reads() -> None:
    review = admission_review("elasticquotas", elastic_quota("a"), namespace_name="teams")
    answer = answered(core.QuotaTreeState(), {**review})
    assert answer.decision == "recorded"
    warned = admission.allowed(request_of(review), warnings=("w",))
    assert msgspec.json.decode(admission.encode_review(warned))["response"] == {
        "uid": review["request"]["uid"],
        "allowed": True,
        "warnings": ["w"],
    }


# --- the I/O half against a scripted quota service


def scripted(*outcomes: CommandReply | Exception) -> tuple[Callable[[CommandRequest], Awaitable[CommandReply]], list]:
    sent: list[CommandRequest] = []
    queue = list(outcomes)

    async def ask(request: CommandRequest) -> CommandReply:
        sent.append(request)
        outcome = queue.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return ask, sent


def update_review() -> dict[str, Any]:
    return admission_review(
        "elasticquotas",
        elastic_quota("a", max={"cpu": "9"}),
        operation="UPDATE",
        old=elastic_quota("a"),
        namespace_name="teams",
        name="a",
        user="alice",
    )


CONFLICT = CommandReply(
    outcome="conflict", tree="default", message="tree default changed while this command was decided"
)
APPLIED = CommandReply(outcome="applied", tree="default", seq=9)


async def test_a_lost_race_is_asked_again_on_fresh_state() -> None:
    registry = new_registry()
    ask, sent = scripted(CONFLICT, APPLIED)
    validation = QuotaValidation(ask, mirror_users=[MIRROR_USER], registry=registry)
    response = await validation(request_of(update_review()))
    assert response.allowed and len(sent) == 2 and sent[0] == sent[1]
    ask, sent = scripted(*[CONFLICT] * QUOTA_CONFLICT_ATTEMPTS)
    response = await QuotaValidation(ask, mirror_users=[], registry=new_registry())(request_of(update_review()))
    assert not response.allowed and response.status is not None and response.status.code == 409
    assert len(sent) == QUOTA_CONFLICT_ATTEMPTS and CONFLICT.message in response.status.message
    assert 'koordbus_webhook_quota_decisions_total{decision="recorded"} 1.0' in render(registry).decode()


async def test_a_quota_service_that_does_not_answer_refuses_the_change_saying_why() -> None:
    registry = new_registry()
    ask, sent = scripted(
        BusUnavailableError("request koord.v1.rpc.quota.command: nobody serves this subject"),
        RemoteError("koord.v1.rpc.quota.command: boom"),
    )
    validation = QuotaValidation(ask, mirror_users=[MIRROR_USER], registry=registry)
    down = await validation(request_of(update_review()))
    assert (
        not down.allowed
        and down.status is not None
        and (down.status.code, down.status.reason)
        == (
            503,
            "ServiceUnavailable",
        )
    )
    assert "nobody serves this subject" in down.status.message and "try again" in down.status.message
    failed = await validation(request_of(update_review()))
    assert failed.status is not None and failed.status.code == 500 and "boom" in failed.status.message
    # the mirror's writes need no answer from it
    mirror = admission_review(
        "elasticquotas", elastic_quota("a"), operation="UPDATE", old=elastic_quota("a"), user=MIRROR_USER
    )
    assert (await validation(request_of(mirror))).allowed and len(sent) == 2
    text = render(registry).decode()
    assert 'koordbus_webhook_quota_decisions_total{decision="unavailable"} 2.0' in text
    assert 'koordbus_webhook_quota_decisions_total{decision="mirror"} 1.0' in text

"""The NATS auth callout's decision (services.natsauth.core): only the agents' ServiceAccount with one node name in
its token is let in, as that node; everything else is refused with a reason."""

from __future__ import annotations

import pytest

from services.natsauth import core

AGENT = "system:serviceaccount:koordbus:agent"


def user(name: str = AGENT, **extra: list[str]) -> dict[str, object]:
    return {"username": name, "groups": ["system:serviceaccounts"], "extra": extra}


def test_the_agents_pod_bound_token_is_its_node() -> None:
    reviewed = user(**{core.NODE_NAME_EXTRA: ["n1"], core.POD_NAME_EXTRA: ["agent-x"]})
    assert core.decide("t", reviewed, agent_user=AGENT) == core.Allowed(node="n1", pod="agent-x")


@pytest.mark.parametrize(
    ("token", "reviewed", "kind"),
    [
        ("", user(**{core.NODE_NAME_EXTRA: ["n1"]}), "no_token"),
        ("t", None, "not_authenticated"),
        ("t", user("system:serviceaccount:koordbus:k8s", **{core.NODE_NAME_EXTRA: ["n1"]}), "wrong_account"),
        ("t", user(), "no_node"),
        ("t", user(**{core.NODE_NAME_EXTRA: ["n1", "n2"]}), "no_node"),
        ("t", {"username": AGENT, "extra": "not a mapping"}, "no_node"),
    ],
)
def test_anything_else_is_refused(token: str, reviewed: dict[str, object] | None, kind: str) -> None:
    decision = core.decide(token, reviewed, agent_user=AGENT)
    assert isinstance(decision, core.Refused) and decision.kind == kind and decision.reason


def test_the_service_account_is_named_namespace_colon_name() -> None:
    assert core.service_account_user("koordbus:agent") == AGENT
    assert core.service_account_user(AGENT) == AGENT
    with pytest.raises(ValueError, match="namespace:name"):
        core.service_account_user("agent")


def test_a_node_name_that_is_not_one_is_refused_not_made_into_subjects() -> None:
    for bad in ("x" * 5000, "a/b", "node-1\n"):
        user = {"username": AGENT, "extra": {core.NODE_NAME_EXTRA: [bad]}}
        decision = core.decide("t", user, agent_user=AGENT)
        assert isinstance(decision, core.Refused) and decision.kind == "no_node", bad
        assert "invalid authentication.kubernetes.io/node-name" in decision.reason

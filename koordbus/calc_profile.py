"""`koordbus calc colocation-profile`: the ClusterColocationProfile step of koord-manager's Pod mutating webhook on
one Pod (../shared/design/CALC-CONTRACT.md, spec §10), through services.webhook.colocation.

The namespace is "not found" when it is null or names another namespace than the Pod's; `randomDraw` is what every
probability draw returns (absent: a random draw, as Koordinator's rand.Intn(100)). The webhook's refusals (an
invalid probability, an unknown PriorityClass, a patch that cannot be applied) are `{"error": …}`; malformed input
(no pod, an unparsable quantity) exits 2.
"""

from __future__ import annotations

import random
from typing import Annotated, Any, Final

import msgspec

from koordbus.calc_errors import InputError
from services.webhook import colocation

COLOCATION_PROFILE_HELP: Final = (
    "a Pod after the matching ClusterColocationProfiles, as koord-manager's webhook mutates it at CREATE (spec §10)",
    '{"profiles": [{"metadata": {"name": "batch"}, "spec": {"selector": {"matchLabels": {"app": "spark"}},\n'
    '     "qosClass": "BE", "priorityClassName": "koord-batch"}}], "priorityClasses": [{"metadata": {"name":\n'
    '     "koord-batch"}, "value": 5999}], "pod": {"metadata": {"namespace": "jobs", "labels": {"app": "spark"}},\n'
    '     "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "4Gi"}}}]}}}',
)


class PriorityClassInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    metadata: dict[str, Any]
    value: int
    preemption_policy: str | None = None


class ColocationProfileInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pod: dict[str, Any]
    operation: str = "CREATE"
    profiles: list[dict[str, Any]] = []
    namespace: dict[str, Any] | None = None
    priority_classes: list[PriorityClassInput] = []
    feature_gates: dict[str, bool] = {}
    random_draw: Annotated[int, msgspec.Meta(ge=0, le=99)] | None = None


def colocation_profile(inp: ColocationProfileInput) -> dict[str, Any]:
    pod_namespace = (inp.pod.get("metadata") or {}).get("namespace")
    namespace_labels = None
    if inp.namespace is not None and (inp.namespace.get("metadata") or {}).get("name") == pod_namespace:
        namespace_labels = (inp.namespace.get("metadata") or {}).get("labels") or {}
    classes = {
        str(pc.metadata.get("name", "")): colocation.PriorityClass(
            value=pc.value, preemption_policy=pc.preemption_policy
        )
        for pc in inp.priority_classes
    }
    fixed = inp.random_draw

    def draw() -> int:
        return random.randrange(100) if fixed is None else fixed

    try:
        if inp.operation != "CREATE":
            pod = msgspec.json.decode(msgspec.json.encode(inp.pod))
            colocation.integer_amounts(pod)
            return {"pod": pod, "mutated": False}
        pod, mutated = colocation.mutate(
            inp.pod,
            inp.profiles,
            namespace_labels=namespace_labels,
            priority_classes=classes,
            skip_mutating_resources=inp.feature_gates.get("ColocationProfileSkipMutatingResources", False),
            draw=draw,
        )
    except colocation.ProfileError as e:
        return {"error": str(e)}
    except ValueError as e:
        raise InputError(f"$.pod: {e}") from None
    return {"pod": pod, "mutated": mutated}

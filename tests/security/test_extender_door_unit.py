"""Issue #19 point 5, the pure half: a placement reported to the extender's assume/bind verbs that no pod watch
confirms stops counting after the TTL (services.loadaware.state.ASSUMED_TTL_SECONDS), with `now` injected; a
placement on a node the extender does not know is refused with kube-scheduler's ExtenderBindingResult error."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.loadaware import state
from services.loadaware.args import DEFAULT_ARGS
from services.loadaware.extender import Extender
from services.loadaware.settings import LoadAwareSettings
from tests.support.loadaware import node, pod, pod_json, report

NOW = 1_800_000_000.0
TTL = state.ASSUMED_TTL_SECONDS


def extender() -> Extender:
    load = state.LoadState(DEFAULT_ARGS)
    for name in ("a", "b"):
        load.apply_node(name, node(name))
        load.apply_metric(report(name, at=NOW - 5, cpu=1000, memory=1 << 30))
    ext = Extender(load)
    for name in ("web", "db"):
        body = {"Pod": pod_json(name, cpu="4", memory="8Gi"), "NodeNames": ["a", "b"]}
        ext.filter(msgspec.json.encode(body), now=NOW)  # the extender learns the pods
    return ext


def binding(pod_name: str = "web", node_name: str = "a") -> bytes:
    return msgspec.json.encode(
        {"PodName": pod_name, "PodNamespace": "default", "PodUID": f"uid-default-{pod_name}", "Node": node_name}
    )


def test_an_assumed_placement_no_watch_confirms_expires_after_the_ttl() -> None:
    ext = extender()
    assert ext.assume(binding(), now=NOW) == b'{"Error":""}'
    ext.bind(binding("db", "b"), now=NOW + 10)
    ext.state.expire_assumed(NOW + TTL - 0.001)
    assert ext.state.pod_node("default/web") == "a" and ext.state.pod_node("default/db") == "b"
    assert ext.state.expire_assumed(NOW + TTL) == ["default/web"]
    assert ext.state.pod_node("default/web") is None and not ext.state.nodes["a"].pods
    assert ext.state.pod_node("default/db") == "b"  # assumed 10 s later: still counts
    # every verb expires what is due before it decides: a filter at the second TTL's end frees b too
    ext.filter(msgspec.json.encode({"Pod": pod_json("x", cpu="1"), "NodeNames": ["b"]}), now=NOW + 10 + TTL)
    assert ext.state.pod_node("default/db") is None and ext.state.load_of("b") == state.node_load(
        ext.state.nodes["b"].metric,  # type: ignore[arg-type]
        (),
        include_sys=DEFAULT_ARGS.prod_usage_include_sys,
    )


def test_a_placement_the_watch_confirms_never_expires() -> None:
    ext = extender()
    ext.assume(binding(), now=NOW)
    ext.state.apply_pod("default/web", pod("web", cpu="4", memory="8Gi", node_name="a"), node="a", seen_at=NOW + 1)
    assert ext.state.expire_assumed(NOW + 100 * TTL) == []
    assert ext.state.pod_node("default/web") == "a"


def test_a_reassumed_placement_counts_from_its_latest_report() -> None:
    ext = extender()
    ext.assume(binding("web", "a"), now=NOW)
    ext.assume(binding("db", "a"), now=NOW + 5)
    ext.state.forget_pod("default/web")
    ext.assume(binding("web", "b"), now=NOW + 20)  # re-reported after db: expires after it
    assert ext.state.expire_assumed(NOW + 5 + TTL) == ["default/db"]
    assert ext.state.pod_node("default/web") == "b"
    assert ext.state.expire_assumed(NOW + 20 + TTL) == ["default/web"]


def test_assume_and_bind_to_an_unknown_node_are_refused() -> None:
    ext = extender()
    assert msgspec.json.decode(ext.assume(binding(node_name="ghost"), now=NOW)) == {"Error": "node ghost is unknown"}
    placement = ext.bind(binding(node_name="ghost"), now=NOW)
    assert placement.refused == "node ghost is unknown" and placement.assumed is None
    assert ext.state.pod_node("default/web") is None and "ghost" not in ext.state.nodes
    # a node only the pod watch mentioned (no Node, no NodeMetric) is not known either
    ext.state.apply_pod("default/db", pod("db", cpu="1", node_name="ghost"), node="ghost", seen_at=NOW)
    assert b"node ghost is unknown" in ext.assume(binding(node_name="ghost"), now=NOW)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"tls_cert_file": "tls.crt", "tls_key_file": "tls.key"}, "needs tls_key_file and tls_client_ca_file"),
        ({"tls_client_ca_file": "ca.crt"}, "need tls_cert_file"),
        ({"assumed_ttl_seconds": 0}, "assumed_ttl_seconds must be positive"),
    ],
)
def test_half_a_tls_setup_or_no_ttl_is_refused(given: dict[str, Any], message: str) -> None:
    # a serving certificate without a client CA would serve the verbs to anyone over HTTPS
    with pytest.raises(ValueError, match=message):
        LoadAwareSettings(**given)

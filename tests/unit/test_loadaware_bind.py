"""The bind verb's pure half (services.loadaware.extender.Extender.bind / undo over LoadState): what is recorded
at once, and what a failed binding takes back — never an entry the pod watch put there since."""

from __future__ import annotations

import msgspec
import pytest

from services.loadaware import state
from services.loadaware.args import DEFAULT_ARGS
from services.loadaware.extender import RECENT_POD_SECONDS, BadRequest, Extender
from tests.support.loadaware import node, pod, pod_json, report

NOW = 1_800_000_000.0
WEB = pod_json("web", cpu="4", memory="8Gi")


def extender() -> Extender:
    load = state.LoadState(DEFAULT_ARGS)
    for name in ("a", "b"):
        load.apply_node(name, node(name))
        load.apply_metric(report(name, at=NOW - 5, cpu=1000, memory=1 << 30))
    ext = Extender(load)
    ext.filter(msgspec.json.encode({"Pod": WEB, "NodeNames": ["a", "b"]}), now=NOW)  # the extender learns the pod
    return ext


def binding(node_name: str = "a", uid: str = "uid-default-web") -> bytes:
    return msgspec.json.encode({"PodName": "web", "PodNamespace": "default", "PodUID": uid, "Node": node_name})


def test_bind_records_the_placement_and_undo_takes_it_back() -> None:
    ext = extender()
    placement = ext.bind(binding(), now=NOW)
    assert placement.known and placement.key == "default/web"
    assert ext.state.pod_node("default/web") == "a"
    assert ext.state.nodes["a"].pods["default/web"].estimated == {"cpu": 3400, "memory": 6012954214}  # 85%, 70%
    assert ext.undo(placement)
    assert ext.state.pod_node("default/web") is None and not ext.state.nodes["a"].pods
    assert not ext.undo(placement)  # nothing left to take back


def test_undo_leaves_what_the_watch_reported_since() -> None:
    ext = extender()
    placement = ext.bind(binding("a"), now=NOW)
    # the bind failed because another scheduler bound the pod to b, and the watch said so before the answer came
    ext.state.apply_pod("default/web", pod("web", cpu="4", memory="8Gi", node_name="b"), node="b", seen_at=NOW + 1)
    assert not ext.undo(placement)
    assert ext.state.pod_node("default/web") == "b"


def test_a_pod_the_watch_already_placed_is_not_assumed_again() -> None:
    ext = extender()
    ext.state.apply_pod("default/web", pod("web", cpu="4", memory="8Gi", node_name="b"), node="b", seen_at=NOW)
    placement = ext.bind(binding("a"), now=NOW)
    assert placement.known and placement.assumed is None
    assert not ext.undo(placement) and ext.state.pod_node("default/web") == "b"


def test_an_unknown_pod_is_placed_nowhere() -> None:
    ext = extender()
    placement = ext.bind(binding(uid="never-filtered"), now=NOW)
    assert not placement.known and placement.assumed is None
    assert ext.state.pod_node("default/web") is None
    # /assume, by contrast, says so to its caller
    assert b"was not seen by filter" in ext.assume(binding(uid="never-filtered"), now=NOW)


@pytest.mark.parametrize("body", [b"", b"{}", b'{"PodName": 1}'])
def test_a_malformed_binding_is_a_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest, match="not ExtenderBindingArgs"):
        extender().bind(body, now=NOW)


def test_a_pending_pod_event_older_than_the_bind_does_not_take_the_placement_off() -> None:
    ext = extender()
    pending = pod("web", cpu="4", memory="8Gi")
    ext.bind(binding("a"), now=NOW)
    # the watch's event from before the binding arrives after it: the pod is bound, only the event is late
    ext.state.apply_pod("default/web", pending, node="", seen_at=NOW - 1)
    assert ext.state.pod_node("default/web") == "a"
    ext.state.apply_pod("default/web", pod("web", cpu="4", memory="8Gi", node_name="a"), node="a", seen_at=NOW + 1)
    assert list(ext.state.nodes["a"].pods) == ["default/web"]
    ext.state.apply_pod("default/web", None, node="", seen_at=NOW + 2)  # deleted
    assert ext.state.pod_node("default/web") is None
    # /assume promises no binding: there the watch's word stands
    ext.assume(binding("b"), now=NOW)
    ext.state.apply_pod("default/web", pending, node="", seen_at=NOW + 3)
    assert ext.state.pod_node("default/web") is None


def test_a_pod_filtered_long_ago_is_forgotten_and_the_memory_goes_with_it() -> None:
    """The pods remembered for bind are bounded by age, not only by count: one filtered more than
    RECENT_POD_SECONDS ago is unknown to bind (kube-scheduler filters a pod again before another try), and a
    stream of placed pods leaves nothing behind once they are old."""
    ext = extender()
    assert ext.bind(binding(), now=NOW + RECENT_POD_SECONDS).known  # still within the bound
    ext.undo(ext.bind(binding(), now=NOW + RECENT_POD_SECONDS))
    late = ext.bind(binding(), now=NOW + RECENT_POD_SECONDS + 1)
    assert not late.known and late.assumed is None and not ext.recent
    for n in range(50):  # a pod a second, each filtered then placed
        other = pod_json(f"job-{n}", cpu="1", memory="1Gi")
        ext.filter(msgspec.json.encode({"Pod": other, "NodeNames": ["a", "b"]}), now=NOW + 1000 + n)
    assert len(ext.recent) == 50
    ext.filter(msgspec.json.encode({"Pod": WEB, "NodeNames": ["a"]}), now=NOW + 1000 + 49 + RECENT_POD_SECONDS + 0.5)
    assert list(ext.recent) == ["uid-default-web"]  # the 50 are older than the bound: gone

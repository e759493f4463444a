"""bus.subject_transform: the pure transform the in-memory bus applies (the contract suite checks it against a real
nats-server: tests/bus/test_contract.py)."""

from __future__ import annotations

import pytest

from bus import subject_transform as st


def test_fnv1a32_known_values() -> None:
    assert st.fnv1a32(b"") == 0x811C9DC5
    assert st.fnv1a32(b"a") == 0xE40C292C
    assert st.fnv1a32(b"foobar") == 0xBF9CF968


def test_wildcards_are_reordered_and_a_partition_appended() -> None:
    source, destination = "k.node.*.*", "k.node.{{wildcard(1)}}.{{wildcard(2)}}.{{partition(4,1)}}"
    assert st.apply(source, destination, "k.node.a.metrics") == "k.node.a.metrics.0"
    assert st.apply(source, destination, "k.node.b.state") == "k.node.b.state.1"
    assert st.apply("x.*.*", "y.{{ wildcard(2) }}.{{wildcard(1)}}", "x.p.q") == "y.q.p"


def test_a_subject_the_source_does_not_match_is_left_alone() -> None:
    source, destination = "k.node.*.*", "k.node.{{wildcard(1)}}.{{wildcard(2)}}.{{partition(4,1)}}"
    assert st.apply(source, destination, "k.node.a") is None
    assert st.apply(source, destination, "k.node.a.metrics.extra") is None
    assert st.apply(source, destination, "k.other.a.metrics") is None


@pytest.mark.parametrize(
    ("source", "destination"),
    [("k.>", "k.{{wildcard(1)}}"), ("k.*", "k.{{wildcard(2)}}"), ("k.*", "k.{{split(1,-)}}")],
)
def test_unsupported_transforms_are_refused(source: str, destination: str) -> None:
    with pytest.raises(st.TransformError):
        st.apply(source, destination, "k.a")

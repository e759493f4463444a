"""Subject token encoding: reversible for every string, and the result is always one plain NATS token."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import subjects

TOKEN = re.compile(r"^[a-z0-9_~-]+$")


@given(st.text(min_size=1, max_size=80))
def test_any_string_round_trips(name: str) -> None:
    token = subjects.encode_token(name)
    assert TOKEN.match(token), token
    assert subjects.decode_token(token) == name


@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?){0,3}", fullmatch=True))
def test_dns_names_stay_readable(name: str) -> None:
    assert subjects.encode_token(name) == name.replace(".", "_")


def test_node_subjects_parse_back() -> None:
    name = "ip-10-0-0-1.ec2.internal"
    assert subjects.node_metrics(name) == "koord.v1.node.ip-10-0-0-1_ec2_internal.metrics"
    assert subjects.node_of(subjects.node_metrics(name)) == name
    assert subjects.node_of(subjects.nodemetric_computed(name)) == name
    assert subjects.node_of(f"{subjects.nodemetric_computed(name)}.{subjects.node_partition(name)}") == name


def test_partition_filters_name_one_partition_each_of_a_partitioned_streams_filter() -> None:
    assert subjects.partition_filters(subjects.NODEMETRIC_COMPUTED_ALL, [3, 1]) == (
        "koord.v1.nodemetric.*.computed.1",
        "koord.v1.nodemetric.*.computed.3",
    )
    assert subjects.partition_filters(subjects.NODE_STATE_ALL, [0]) == ("koord.v1.node.*.state.0",)
    with pytest.raises(subjects.SubjectError):
        subjects.partition_filters(subjects.NODERESOURCE_COMPUTED_ALL, [0])  # that stream is not partitioned
    source, destination = subjects.NODEMETRIC_TRANSFORM
    assert _matches(source, subjects.nodemetric_computed("a.b"))
    assert destination.endswith(f".{{{{partition({subjects.NODE_PARTITIONS},1)}}}}")


@pytest.mark.parametrize("bad", ["", "a.b", "A", "a~zz", "a~4"])
def test_bad_tokens_are_rejected(bad: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.decode_token(bad)


def test_not_a_node_subject() -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.node_of("koord.v1.quota.x")


def _matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: `*` one token, `>` one or more trailing tokens."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or token not in ("*", have[index]):
            return False
    return len(want) == len(have)


@given(st.text(min_size=1, max_size=20))
def test_the_config_status_subject_is_in_the_noderesource_stream_and_never_a_decision(node: str) -> None:
    assert _matches(subjects.NODERESOURCE_ALL, subjects.NODERESOURCE_CONFIG_STATUS)
    assert not _matches(subjects.NODERESOURCE_COMPUTED_ALL, subjects.NODERESOURCE_CONFIG_STATUS)
    assert subjects.noderesource_computed(node) != subjects.NODERESOURCE_CONFIG_STATUS
    assert _matches(subjects.NODERESOURCE_COMPUTED_ALL, subjects.noderesource_computed(node))


def test_the_longest_kubernetes_name_is_a_token() -> None:
    name = ".".join(["a" * 63] * 4)[:253]
    assert subjects.decode_token(subjects.encode_token(name)) == name


@pytest.mark.parametrize(
    "name",
    [
        "x" * 254,  # longer than any Kubernetes name
        "x" * 5000,  # the reproducer: it made a subject longer than nats-server's control line
        "\U0001f600" * 100,  # 100 characters, 1200 once encoded
    ],
)
def test_an_oversize_name_is_refused_not_encoded(name: str) -> None:
    with pytest.raises(subjects.SubjectError, match="subject token"):
        subjects.encode_token(name)
    with pytest.raises(subjects.SubjectError):
        subjects.node_actuation(name)


def test_a_subject_of_two_longest_tokens_fits_the_control_line() -> None:
    worst = "\U0001f600" * (subjects.MAX_TOKEN_CHARS // 12)
    subject = subjects.cluster_pod(worst, worst)
    assert len(subject) + 100 < 4096  # room for a reply subject and the sizes

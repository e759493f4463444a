"""schemas.names: Kubernetes' own name rules, one error naming the field, values quoted back shortened."""

import pytest

from schemas import names


@pytest.mark.parametrize(
    "good", ["a", "n1", "ip-10-0-0-1.ec2.internal", "koordinator-root-quota", ".".join(["a" * 63] * 4)[:253]]
)
def test_object_names_are_dns_subdomains(good: str) -> None:
    assert names.object_name(good) == good
    assert names.node_name(good) == good


@pytest.mark.parametrize(
    "bad",
    ["", "a/b", "..", ".", "a\x00b", "caf\u00e9", "A", "-a", "a-", "a_b", "a..b", "x" * 254, "n1\n", " n1"],
)
def test_object_names_refuse_what_kubernetes_refuses(bad: str) -> None:
    with pytest.raises(names.InvalidName) as info:
        names.object_name(bad, "metadata.name")
    assert info.value.field == "metadata.name"
    assert str(info.value).startswith("invalid metadata.name ")


def test_a_huge_name_is_quoted_short() -> None:
    with pytest.raises(names.InvalidName) as info:
        names.node_name("x" * 100_000)
    message = str(info.value)
    assert len(message) < 300
    assert "100000 characters" in message
    assert "at most 253" in message


@pytest.mark.parametrize("good", ["default", "kube-system", "a" * 63])
def test_namespaces_are_dns_labels(good: str) -> None:
    assert names.namespace(good) == good


@pytest.mark.parametrize("bad", ["", "a.b", "a" * 64, "Ns", "ns\n"])
def test_namespaces_refuse_dots_and_length(bad: str) -> None:
    with pytest.raises(names.InvalidName, match="invalid namespace"):
        names.namespace(bad)


@pytest.mark.parametrize("good", ["", "v1", "Tree_1.a-b", "a" * 63, "1234567890123456789"])
def test_label_values(good: str) -> None:
    assert names.label_value(good) == good


@pytest.mark.parametrize("bad", ["a" * 64, "-a", "a_", "a/b", "a b", "t\n"])
def test_label_values_refused(bad: str) -> None:
    with pytest.raises(names.InvalidName):
        names.label_value(bad, "metadata.labels[quota.scheduling.koordinator.sh/tree-id]")


def test_a_tree_is_a_label_value_or_a_profile_name() -> None:
    assert names.tree_id("default") == "default"
    assert names.tree_id("Tree_1") == "Tree_1"
    long_profile = "p." + "a" * 100
    assert names.tree_id(long_profile) == long_profile
    for bad in ("", "x" * 5000, "a/b", "Tree_" + "a" * 70):
        with pytest.raises(names.InvalidName, match="invalid tree"):
            names.tree_id(bad)


def test_pod_uids_and_container_ids_fullmatch() -> None:
    uid = "0b4e3c1a-9d2f-4c5b-8a7e-1f2d3c4b5a69"
    assert names.is_pod_uid(uid)
    assert names.is_pod_uid("0123456789abcdef0123456789abcdef")
    assert not names.is_pod_uid(uid + "\n")  # re.match with `$` let this through
    assert not names.is_pod_uid(uid.upper())
    assert names.is_container_id("abcdef01")
    assert not names.is_container_id("abcdef01\n")
    assert not names.is_container_id("../../etc")
    with pytest.raises(names.InvalidName, match="pod uid"):
        names.pod_uid(uid + "\n")
    with pytest.raises(names.InvalidName, match="container id"):
        names.container_id("abc")


def test_uids_as_filters() -> None:
    assert names.uid("rs-uid-1") == "rs-uid-1"
    with pytest.raises(names.InvalidName):
        names.uid("a/b")

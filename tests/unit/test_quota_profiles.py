"""ElasticQuotaProfile roots (spec §3.10): tree id, the selected nodes' allocatable times the ratio as min, the
MaxInt64/2000 max, the annotations, and when a held root needs writing."""

from __future__ import annotations

import msgspec

from schemas import kube, quota
from services.quota import profiles

NODES = [
    ({"pool": "gpu"}, {"cpu": 32_000, "memory": 128 * 2**30, "nvidia.com/gpu": 8}),
    ({"pool": "gpu"}, {"cpu": 32_000, "memory": 128 * 2**30, "nvidia.com/gpu": 8}),
    ({"pool": "cpu"}, {"cpu": 64_000, "memory": 256 * 2**30}),
]


def profile(**spec: object) -> quota.ElasticQuotaProfile:
    return msgspec.convert(
        {
            "metadata": {"name": "gpu", "namespace": "teams"},
            "spec": {"quotaName": "gpu-root", "nodeSelector": {"matchLabels": {"pool": "gpu"}}, **spec},
        },
        quota.ElasticQuotaProfile,
    )


def test_fnv64a_matches_the_reference_vectors() -> None:
    assert profiles.fnv64a("") == 0xCBF29CE484222325
    assert profiles.fnv64a("a") == 0xAF63DC4C8601EC8C
    assert profiles.tree_id(profile()) == str(profiles.fnv64a("teams/gpu"))
    assert profiles.tree_id(profile(quotaLabels={quota.LABEL_TREE_ID: "gpu-tree"})) == "gpu-tree"


def test_the_root_is_sized_by_the_selected_nodes_times_the_ratio() -> None:
    root = profiles.desired_root(profile(resourceRatio="0.9"), NODES)
    spec = quota.quota_spec(root)
    assert spec.min == {"cpu": 57_600, "memory": int(256 * 2**30 * 0.9)}
    assert spec.max == {"cpu": profiles.MAX_AMOUNT * 1000, "memory": profiles.MAX_AMOUNT}
    assert spec.is_root and spec.is_parent and spec.tree_id == profiles.tree_id(profile())
    assert spec.total_resource == {"cpu": 57_600, "memory": int(256 * 2**30 * 0.9), "nvidia.com/gpu": 14}
    assert root.metadata.labels[quota.LABEL_PROFILE] == "gpu" and root.metadata.namespace == "teams"
    assert profiles.ratio(profile(resourceRatio="1.5")) is None  # out of (0, 1]: not applied


def test_resource_keys_come_from_the_annotation() -> None:
    keyed = msgspec.structs.replace(
        profile(),
        metadata=kube.ObjectMeta(
            name="gpu", namespace="teams", annotations={quota.ANNOTATION_RESOURCE_KEYS: '["nvidia.com/gpu"]'}
        ),
    )
    assert quota.quota_spec(profiles.desired_root(keyed, NODES)).min == {"nvidia.com/gpu": 16}


def test_a_held_root_needs_writing_only_when_its_figures_or_labels_differ() -> None:
    desired = profiles.desired_root(profile(), NODES)
    assert profiles.needs_write(None, desired)
    held = profiles.merged(None, desired)
    assert not profiles.needs_write(held, desired)
    grown = profiles.desired_root(profile(), [*NODES, ({"pool": "gpu"}, {"cpu": 1_000})])
    assert profiles.needs_write(held, grown)
    extra = msgspec.structs.replace(
        held, metadata=msgspec.structs.replace(held.metadata, annotations={**held.metadata.annotations, "x": "y"})
    )
    assert profiles.merged(extra, grown).metadata.annotations["x"] == "y"

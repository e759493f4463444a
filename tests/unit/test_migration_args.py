"""MigrationControllerArgs (spec §4.3): Koordinator's JSON names and defaults, GetMaxUnavailable, durations and the
checks that refuse unusable args."""

from __future__ import annotations

import msgspec
import pytest

from services.common.args import ArgsError
from services.migration.args import (
    MigrationArgs,
    check_args,
    duration_seconds,
    get_max_unavailable,
    load_args,
    scaled,
)


def test_defaults_and_koordinator_names() -> None:
    args = msgspec.json.decode(b"{}", type=MigrationArgs)
    assert args.max_migrating_per_node == 2 and args.max_migrating_globally is None
    assert args.default_job_mode == "ReservationFirst" and args.scheduler_names == ["koord-scheduler"]
    assert args.object_limiters["workload"].duration == "5m" and (args.evict_qps, args.evict_burst) == (10.0, 1)
    given = msgspec.json.decode(
        b'{"maxMigratingPerNode": 0, "maxUnavailablePerWorkload": "20%", "skipEvictionGates": ["PVC"],'
        b' "objectLimiters": {"namespace": {"duration": "1m", "maxMigrating": 3}}}',
        type=MigrationArgs,
    )
    assert given.max_migrating_per_node == 0 and given.max_unavailable_per_workload == "20%"
    assert not given.gate_on("PVC") and given.gate_on("LabelSelector")
    assert set(given.object_limiters) == {"namespace"}


@pytest.mark.parametrize(
    ("replicas", "value", "expected"),
    [
        (20, None, 2),  # > 10: 10%
        (11, None, 1),
        (10, None, 2),  # 4..10: 2
        (4, None, 2),
        (3, None, 1),  # below 4: 1
        (1, None, 1),
        (10, "50%", 5),
        (10, "5%", 1),  # floor(0.5) = 0 → 1
        (10, 0, 1),
        (10, 3, 3),
        (2, 5, 2),  # at most the replicas
        (0, None, 0),
    ],
)
def test_get_max_unavailable(replicas: int, value: int | str | None, expected: int) -> None:
    assert get_max_unavailable(replicas, value) == expected


def test_scaled_and_durations_refuse_nonsense() -> None:
    assert scaled("33%", 10) == 3
    for bad in ("ten", "10 %", "-1%"):
        with pytest.raises(ArgsError, match="integer or a percent"):
            scaled(bad, 10)
    assert duration_seconds("5m") == 300 and duration_seconds("1h30m") == 5400 and duration_seconds("500ms") == 0.5
    assert duration_seconds("") == 0
    with pytest.raises(ArgsError, match="not a duration"):
        duration_seconds("5 minutes")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'{"maxMigratingPerNode": -1}', "maxMigratingPerNode must not be negative"),
        (b'{"maxUnavailablePerWorkload": "half"}', "maxUnavailablePerWorkload must be an integer or a percent"),
        (b'{"skipEvictionGates": ["Nope"]}', "unknown gate(s) Nope"),
        (b'{"evictQPS": 0}', "evictQPS must be positive"),
        (b'{"objectLimiters": {"pods": {"duration": "1m"}}}', "unknown type 'pods'"),
        (b'{"objectLimiters": {"workload": {"duration": "soon"}}}', "objectLimiters.workload.duration"),
    ],
)
def test_check_args_names_the_field(document: bytes, message: str) -> None:
    with pytest.raises(ArgsError) as info:
        check_args(msgspec.json.decode(document, type=MigrationArgs))
    assert message in str(info.value)


def test_load_args_reads_yaml_and_names_what_is_wrong() -> None:
    from services.migration.args import load_args

    args = load_args("maxMigratingPerNode: 1\nmaxUnavailablePerWorkload: 25%\n", source="a.yaml")
    assert args.max_migrating_per_node == 1 and args.max_unavailable_per_workload == "25%"
    assert load_args("", source="empty").max_migrating_per_node == 2
    for text, message in (
        ("[1, 2]", "a.yaml: expected an object"),
        ("maxMigratingPerNode: lots", "a.yaml: Expected `int | null`"),
        ("maxMigratingPerNode: -3", "maxMigratingPerNode must not be negative"),
        ("key: [unclosed", "a.yaml: not JSON or YAML"),
    ):
        with pytest.raises(ArgsError) as info:
            load_args(text, source="a.yaml")
        assert message in str(info.value), str(info.value)


def test_eviction_policy_and_default_delete_options() -> None:
    assert load_args("{}").eviction_policy == "Eviction" and load_args("{}").default_delete_options is None
    for policy in ("Eviction", "Delete", "SoftEviction"):
        assert load_args(f"evictionPolicy: {policy}").eviction_policy == policy
    with pytest.raises(
        ArgsError, match=r"evictionPolicy: unknown policy 'Drain' \(known: Eviction, Delete, SoftEviction\)"
    ):
        load_args("evictionPolicy: Drain")
    args = load_args("defaultDeleteOptions: {gracePeriodSeconds: 30, propagationPolicy: Background}")
    assert args.default_delete_options is not None and args.default_delete_options.grace_period_seconds == 30
    for bad, message in (
        ("{gracePeriodSeconds: -1}", ">= 0"),
        ("{unsafe: true}", "unknown field `unsafe`"),
        ("{propagationPolicy: Orphan, orphanDependents: true}", "may not both be set"),
    ):
        with pytest.raises(ArgsError, match=message):
            load_args(f"defaultDeleteOptions: {bad}")

"""Validation of the `slo-controller-config` ConfigMap at CREATE and UPDATE (spec §7.1, Koordinator's
pkg/webhook/cm/plugins/sloconfig): each key koordbus reads is checked by the parser the service that reads it uses,
so `kubectl apply` refuses what a service would otherwise find broken only after the fact. Pure.

A key is checked by its `KeyValidator` (the key's text → its problems, each a JSON path inside the key's JSON and a
reason; [] when the service would accept it). `COMMON_VALIDATORS` are the keys read through services.common: the
node QoS strategies (resource-threshold-config, resource-qos-config, cpu-burst-config, system-config, by
services.common.sloconfig, as services.slo renders NodeSLOs), host-application-config, and load-watermarks-config
(services.common.watermarks, as the load-aware scheduler and the descheduler read it). The noderesource service's
keys (colocation-config, cpu-normalization-config) are validated by its own parsers, which the composition root adds
to the table (koordbus.webhook): a service imports no other service, and the table is where another key's owner
plugs in. On top of the parsers, Koordinator's webhook rule for per-node entries: every nodeStrategies /
nodeConfigs entry needs a non-empty, valid nodeSelector (schemas.selectors.node_profile_problems).

Which keys are checked: at CREATE every key the table knows; at UPDATE only those whose value changed (added or
edited). An admin fixing one key must not be blocked by another key that was already bad and is left as it was
(the services keep that key's last good value and report it), and a ConfigMap that only changes keys nobody here
reads passes. A removed key is never refused: the services fall back to its defaults. Every problem of every
checked key is reported, each as `data.<key>: <JSON path>: <reason>`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import msgspec

from schemas.selectors import LabelSelector, node_profile_problems
from services.common import sloconfig, watermarks

Problem = tuple[str, str]
"""(JSON path inside the key's JSON, reason): ("$.clusterStrategy.cpuBurstPercent", "20000 is out of range …")."""
KeyValidator = Callable[[str], Sequence[Problem]]
"""A key's text → its problems ([] when the service that reads it would use it)."""


class KeyProblem(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    path: str
    reason: str

    @property
    def field(self) -> str:
        """Where in the ConfigMap: `data[<key>]` (the API server's field path for a map key)."""
        return f"data[{self.key}]"

    def __str__(self) -> str:
        return f"data.{self.key}: {self.path}: {self.reason}"


_MSGSPEC_PATH: Final = re.compile(r"^(?P<reason>.*) - at `(?P<path>\$[^`]*)`$", re.DOTALL)
_LEADING_PATH: Final = re.compile(r"^(?P<path>\$[^:\s]*): (?P<reason>.*)$", re.DOTALL)


def problem_of(message: str) -> Problem:
    """A parser's error message as (path, reason): msgspec's "Expected `int`, got `str` - at `$.x`" or our own
    "$.x: reason"; a message naming no path is about the whole key ("$")."""
    if (found := _MSGSPEC_PATH.match(message)) is not None:
        reason = found["reason"].replace("`", "")
        return found["path"], reason[:1].lower() + reason[1:]
    if (found := _LEADING_PATH.match(message)) is not None:
        return found["path"], found["reason"]
    return "$", message


def _entry_problems(selectors: Sequence[LabelSelector | None], list_name: str) -> list[Problem]:
    return [
        (f"$.{list_name}[{index}].nodeSelector", reason)
        for index, selector in enumerate(selectors)
        for reason in node_profile_problems(selector)
    ]


def strategy_validator(key: sloconfig.SloKey) -> KeyValidator:
    """A node QoS strategy key, as services.slo reads it (services.common.sloconfig.parse_strategy)."""

    def validate(text: str) -> list[Problem]:
        try:
            parsed = sloconfig.parse_strategy(key, text)
        except sloconfig.SloConfigError as err:
            return [(problem.path, problem.reason) for problem in err.problems]
        return _entry_problems([node.node_selector for node in parsed.nodes], "nodeStrategies")

    return validate


def host_applications_problems(text: str) -> list[Problem]:
    try:
        parsed = sloconfig.parse_host_applications(text)
    except sloconfig.SloConfigError as err:
        return [(problem.path, problem.reason) for problem in err.problems]
    return _entry_problems([node.node_selector for node in parsed.nodes], "nodeConfigs")


def watermarks_problems(text: str) -> list[Problem]:
    try:
        watermarks.parse_watermarks(text)
    except watermarks.WatermarksError as err:
        return [problem_of(str(err))]
    return []


COMMON_VALIDATORS: Final[Mapping[str, KeyValidator]] = {
    **{key.config_key: strategy_validator(key) for key in sloconfig.STRATEGY_KEYS},
    sloconfig.HOST_APPLICATION_KEY: host_applications_problems,
    watermarks.WATERMARKS_KEY: watermarks_problems,
}


def keys_to_check(
    new: Mapping[str, str], old: Mapping[str, str] | None, validators: Mapping[str, KeyValidator]
) -> list[str]:
    """The keys the table knows that CREATE (`old` None) or this UPDATE brings: all of them at CREATE, the added or
    edited ones at UPDATE."""
    return [key for key in validators if key in new and (old is None or old.get(key) != new[key])]


def problems(
    new: Mapping[str, str], old: Mapping[str, str] | None, validators: Mapping[str, KeyValidator]
) -> list[KeyProblem]:
    """Every problem of every key to check, in the table's order."""
    return [
        KeyProblem(key=key, path=path, reason=reason)
        for key in keys_to_check(new, old, validators)
        for path, reason in _checked(validators[key], new[key])
    ]


def _checked(validator: KeyValidator, text: str) -> list[Problem]:
    """The validator's problems; a value its parser cannot even read (nested deeper than Python recurses, text that
    is not Unicode) is one problem at "$" rather than an error: the services would not read it either."""
    try:
        return list(validator(text))
    except RecursionError:
        return [("$", "nested too deep to be read")]
    except ValueError as err:
        return [("$", f"cannot be read: {err}")]

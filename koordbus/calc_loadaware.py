"""`koordbus calc loadaware` and `koordbus calc loadaware-estimate` (../shared/design/CALC-CONTRACT.md, spec §6).

Registered in koordbus.calc.CALCULATORS. `loadaware` reads one node's state (services.loadaware.snapshot builds the
extender's LoadState from it) and answers with what the load-aware extender decides for the incoming pod: filter
status and Koordinator's reason, the 0–100 score, the estimates compared, the node's assigned-pod cache, and the
arithmetic under `explain`. `loadaware-estimate` is the DefaultEstimator alone (services.loadaware.estimator), on
args defaulted but not validated, as Koordinator's estimator tests call it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from koordbus.calc_errors import InputError
from schemas import kube
from services.common.args import ArgsError, ArgsFormatError
from services.loadaware import estimator, snapshot
from services.loadaware.args import convert_args, with_defaults

NodeStateInput = snapshot.NodeStateInput


def loadaware(inp: NodeStateInput) -> dict[str, Any]:
    try:
        load, node, now = snapshot.read(inp)
    except (ArgsFormatError, snapshot.SnapshotError) as err:
        raise InputError(str(err)) from None
    except ArgsError as err:
        return {"error": str(err)}
    return snapshot.decide(load, node, inp.pod or kube.Pod(), now=now)


class EstimateInput(msgspec.Struct, frozen=True, kw_only=True):
    args: dict[str, Any] | None = None
    pod: kube.Pod | None = None
    node: kube.Node | None = None


def loadaware_estimate(inp: EstimateInput) -> dict[str, Any]:
    try:
        args = with_defaults(convert_args(inp.args, source="$.args"))
    except ArgsFormatError as err:
        raise InputError(str(err)) from None
    out: dict[str, Any] = {}
    if inp.pod is not None:
        out.update(estimator.estimate_factors(inp.pod, args))
    if inp.node is not None:
        out["allocatable"] = estimator.estimate_node(inp.node)
    return out

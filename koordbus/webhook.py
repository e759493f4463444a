"""`koordbus service webhook`'s assembly: the slo-controller-config validators of every service that reads a key, and
the process (settings, the bus, the HTTPS server with its certificate reloader, the plain port).

The validator table is here because only the composition root may import every service: services.webhook holds the
keys read through services.common (services.webhook.configmap.COMMON_VALIDATORS) and gets the noderesource service's
own parsers for colocation-config and cpu-normalization-config from this table, so each key is checked by the code
that reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from services.noderesource import config as colocation_config
from services.noderesource import cpu_normalization
from services.webhook import configmap

SLO_CONFIG_VALIDATORS: Final[Mapping[str, configmap.KeyValidator]] = {
    colocation_config.COLOCATION_CONFIG_KEY: colocation_config.config_problems,
    cpu_normalization.CONFIG_KEY: cpu_normalization.config_problems,
    **configmap.COMMON_VALIDATORS,
}
"""Every key of the slo-controller-config koordbus reads → the check of the service that reads it."""

"""Settings of the NATS auth callout (`koordbus natsauth`), from KOORDBUS_NATSAUTH_* or the shared KOORDBUS_* variables
(services.common.settings.load)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, kw_only=True)
class NatsAuthSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_NATSAUTH_"
    """Each field from KOORDBUS_NATSAUTH_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    agent_service_account: str = ""
    """KOORDBUS_AGENT_SERVICE_ACCOUNT: `namespace:name` of the agents' ServiceAccount; only its tokens are let in."""
    issuer_seed_file: str = ""
    """KOORDBUS_ISSUER_SEED_FILE: file holding the account nkey seed (`SA…`) whose public key is the `issuer` of
    nats-server's `auth_callout` block (the Secret `koordbus creds ensure-cluster-secret` makes)."""
    token_audience: str = ""
    """KOORDBUS_TOKEN_AUDIENCE: the audience the agents' projected tokens are issued for (the TokenReview asks for
    it, so a token meant for another audience is refused); empty: the API server's default audience."""
    account: str = "KOORD"
    """KOORDBUS_ACCOUNT: the NATS account the agents are placed in (where the streams are)."""
    concurrency: int = 16
    """KOORDBUS_CONCURRENCY: requests answered at once (each waits for a TokenReview): after a NATS restart every
    agent reconnects at the same moment."""

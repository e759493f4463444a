"""NATS nkeys and JWTs (bus.nkeys, bus.natsjwt): encodings nats-server reads, signatures that verify and tampering
that does not, and the authorization request a real nats-server 2.15.1 sent, decoded."""

from __future__ import annotations

import base64
import json

import pytest

from bus import auth, natsjwt, nkeys

SEED = bytes(range(32))

CAPTURED_REQUEST = (
    "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJhdWQiOiJuYXRzLWF1dGhvcml6YXRpb24tcmVxdWVzdCIsImV4c"
    "CI6MTc5NTQ4OTIyOCwianRpIjoiREhWNzMzTEhGTjdDSzVDTFdLMjZRUTVZNUpHS1Q2MklKVEVOVExWNUpTVEhZR1YzT09BQSIsI"
    "mlhdCI6MTc5NTQ4OTIyMywiaXNzIjoiTkFVV0E3WjNGRlBCQkJOVkFPSTU0WUlVTlNSR0kzVVdVUEVRTzdLS0dTU1k3WTJUUFpVW"
    "UpRV1UiLCJzdWIiOiJBQ0FLV0dYNVZHRFpEUFhZSlM0N042UUJWUldWVlZBNEJNSE4yQUhEV0pPQVdUN0RJTFVTNVdUWiIsIm5hd"
    "HMiOnsic2VydmVyX2lkIjp7Im5hbWUiOiJOQVVXQTdaM0ZGUEJCQk5WQU9JNTRZSVVOU1JHSTNVV1VQRVFPN0tLR1NTWTdZMlRQW"
    "lVZSlFXVSIsImhvc3QiOiIxMjcuMC4wLjEiLCJpZCI6Ik5BVVdBN1ozRkZQQkJCTlZBT0k1NFlJVU5TUkdJM1VXVVBFUU83S0tHU"
    "1NZN1kyVFBaVVlKUVdVIiwidmVyc2lvbiI6IjIuMTUuMSJ9LCJ1c2VyX25rZXkiOiJVQ05RMlRXU1NZQ1ZYU1ZJNTdBRFdPVko1T"
    "Eo3UDZMSzRaTTZQWVJSRlNWTVJLNU1CVFpXQ0FRSyIsImNsaWVudF9pbmZvIjp7Imhvc3QiOiIxMjcuMC4wLjEiLCJpZCI6OSwid"
    "XNlciI6IltSRURBQ1RFRF0iLCJuYW1lIjoiYWdlbnQtbjEiLCJraW5kIjoiQ2xpZW50IiwidHlwZSI6Im5hdHMifSwiY29ubmVjd"
    "F9vcHRzIjp7ImF1dGhfdG9rZW4iOiJhZ2VudC10b2tlbiIsIm5hbWUiOiJhZ2VudC1uMSIsImxhbmciOiJweXRob24zIiwidmVyc"
    "2lvbiI6IjIuMTYuMCIsInByb3RvY29sIjoxfSwidHlwZSI6ImF1dGhvcml6YXRpb25fcmVxdWVzdCIsInZlcnNpb24iOjJ9fQ.lf"
    "Y6ovCHGvQfOzihpj_MIVvxwynTHJ60bDMUTMtdZvR_Oj8XRlUMe8q97-JL-8xH3gfv9k81UIaI8Bc8r28tAA"
)
"""What nats-server 2.15.1 sent the callout for a client connecting with token "agent-token" and name "agent-n1"
(a callout configured with `auth.render_callout_authorization`)."""
CAPTURED_AT = 1795489223


def test_keys_encode_as_nats_writes_them_and_round_trip() -> None:
    account = nkeys.from_random(nkeys.Prefix.ACCOUNT, SEED)
    assert account.public_key.startswith("A") and len(account.public_key) == 56
    assert account.seed.startswith("SA") and len(account.seed) == 58
    again = nkeys.from_seed(account.seed)
    assert again == account and again.public_key == account.public_key
    user = nkeys.from_random(nkeys.Prefix.USER, SEED)
    assert user.public_key.startswith("U") and user.seed.startswith("SU")
    assert nkeys.is_public(account.public_key, nkeys.Prefix.ACCOUNT)
    assert not nkeys.is_public(account.public_key, nkeys.Prefix.USER)


def test_a_damaged_key_or_seed_is_refused() -> None:
    public = nkeys.from_random(nkeys.Prefix.ACCOUNT, SEED).public_key
    flipped = public[:10] + ("B" if public[10] != "B" else "C") + public[11:]
    assert not nkeys.is_public(flipped, nkeys.Prefix.ACCOUNT)  # the checksum catches it
    with pytest.raises(nkeys.NkeyError, match="seed"):
        nkeys.from_seed(public)
    with pytest.raises(nkeys.NkeyError):
        nkeys.from_random(nkeys.Prefix.ACCOUNT, b"short")


def test_signatures_verify_only_for_their_key_and_data() -> None:
    key = nkeys.from_random(nkeys.Prefix.ACCOUNT, SEED)
    other = nkeys.from_random(nkeys.Prefix.ACCOUNT, bytes(32))
    signature = key.sign(b"data")
    assert nkeys.verify(key.public_key, nkeys.Prefix.ACCOUNT, b"data", signature)
    assert not nkeys.verify(key.public_key, nkeys.Prefix.ACCOUNT, b"datA", signature)
    assert not nkeys.verify(other.public_key, nkeys.Prefix.ACCOUNT, b"data", signature)
    assert not nkeys.verify(key.public_key, nkeys.Prefix.USER, b"data", signature)


def test_a_real_servers_request_decodes() -> None:
    request = natsjwt.parse_request(CAPTURED_REQUEST, now=CAPTURED_AT)
    assert request.token == "agent-token" and request.client_name == "agent-n1"
    assert request.client_host == "127.0.0.1"
    assert request.server_id.startswith("N") and nkeys.is_public(request.user_nkey, nkeys.Prefix.USER)
    with pytest.raises(natsjwt.JwtError, match="expired"):  # the server gives it its auth timeout (5 s) to live
        natsjwt.parse_request(CAPTURED_REQUEST, now=CAPTURED_AT + 60)


def _tamper(token: str, change: dict[str, object]) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["nats"].update(change)
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{header}.{forged}.{signature}"


def test_a_tampered_or_foreign_request_is_refused() -> None:
    with pytest.raises(natsjwt.JwtError, match="signature"):
        natsjwt.parse_request(_tamper(CAPTURED_REQUEST, {"connect_opts": {"auth_token": "x"}}), now=CAPTURED_AT)
    account = nkeys.from_random(nkeys.Prefix.ACCOUNT, SEED)
    not_a_server = natsjwt.encode({"aud": natsjwt.REQUEST_AUDIENCE, "nats": {}}, account, now=CAPTURED_AT)
    with pytest.raises(natsjwt.JwtError, match="signature"):  # signed, but by an account key, not a server's
        natsjwt.parse_request(not_a_server, now=CAPTURED_AT)
    with pytest.raises(natsjwt.JwtError, match="3 dot-separated parts"):
        natsjwt.parse_request("garbage", now=CAPTURED_AT)


def test_the_answer_carries_a_user_for_that_connection_signed_by_the_issuer() -> None:
    request = natsjwt.parse_request(CAPTURED_REQUEST, now=CAPTURED_AT)
    issuer = nkeys.from_random(nkeys.Prefix.ACCOUNT, SEED)
    user = natsjwt.user_jwt(
        request, issuer=issuer, account="KOORD", name="node-n1", permissions=auth.node_permissions("n1"),
        now=CAPTURED_AT,
    )  # fmt: skip
    answer = natsjwt.decode(
        natsjwt.response(request, issuer=issuer, user=user, now=CAPTURED_AT),
        issuer_prefix=nkeys.Prefix.ACCOUNT,
        now=CAPTURED_AT,
    )
    assert answer["sub"] == request.user_nkey and answer["aud"] == request.server_id
    assert answer["iss"] == issuer.public_key and answer["nats"]["type"] == "authorization_response"
    claims = natsjwt.decode(answer["nats"]["jwt"], issuer_prefix=nkeys.Prefix.ACCOUNT, now=CAPTURED_AT)
    assert claims["sub"] == request.user_nkey and claims["aud"] == "KOORD" and claims["name"] == "node-n1"
    assert claims["nats"]["pub"] == auth.node_permissions("n1")["publish"]
    assert "koord.v1.node.n1.>" in claims["nats"]["pub"]["allow"]
    assert claims["nats"]["sub"] == {"allow": ["_INBOX.>"]} and claims["nats"]["type"] == "user"
    refused = natsjwt.response(request, issuer=issuer, error="no token", now=CAPTURED_AT)
    refusal = natsjwt.decode(refused, issuer_prefix=nkeys.Prefix.ACCOUNT, now=CAPTURED_AT)
    assert refusal["nats"] == {"type": "authorization_response", "version": 2, "error": "no token"}
    with pytest.raises(ValueError, match="exactly one"):
        natsjwt.response(request, issuer=issuer, now=CAPTURED_AT)

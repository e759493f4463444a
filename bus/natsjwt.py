"""NATS JWTs for the auth callout: the authorization request nats-server sends on `$SYS.REQ.USER.AUTH`, the
response the callout answers with, and the user JWT inside it (nats-io/jwt v2 shapes, ed25519-nkey signed).

services.natsauth decodes each request here (signature checked against the server key that issued it), decides, and
encodes the answer: a user JWT for the request's `user_nkey`, issued by the callout's account key, placed in the
account named by its audience, with the permissions of bus.auth (translated from the server-config shape to the JWT
shape), wrapped in a response for that server. Pure: the clock comes in as `now`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus import nkeys

ALGORITHM = "ed25519-nkey"
REQUEST_TYPE = "authorization_request"
RESPONSE_TYPE = "authorization_response"
USER_TYPE = "user"
REQUEST_AUDIENCE = "nats-authorization-request"
NO_LIMIT = -1


class JwtError(ValueError):
    """Not a NATS JWT we accept: malformed, badly signed, expired or of another type."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise JwtError(f"not base64url: {e}") from None


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def encode(claims: Mapping[str, Any], signer: nkeys.KeyPair, *, now: float) -> str:
    """`claims` signed by `signer` (its public key becomes `iss`), with `iat` and a `jti` hashed from the claims."""
    body = {**claims, "iss": signer.public_key, "iat": int(now)}
    body.pop("jti", None)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": ALGORITHM}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signed = f"{header}.{payload}"
    return f"{signed}.{_b64(signer.sign(signed.encode()))}"


def decode(token: str, *, issuer_prefix: nkeys.Prefix, now: float) -> dict[str, Any]:
    """The claims of `token`, once its header, its signature (by the key in its own `iss`, of kind `issuer_prefix`)
    and its validity times check out; JwtError naming the first thing that does not."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("a JWT has 3 dot-separated parts")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except ValueError as e:
        raise JwtError(f"JWT header or claims are not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("alg") != ALGORITHM:
        raise JwtError(f"JWT algorithm must be {ALGORITHM}")
    if not isinstance(claims, dict):
        raise JwtError("JWT claims are not an object")
    issuer = claims.get("iss")
    signed = f"{parts[0]}.{parts[1]}".encode()
    if not isinstance(issuer, str) or not nkeys.verify(issuer, issuer_prefix, signed, _unb64(parts[2])):
        raise JwtError(f"JWT signature does not verify against its issuer {str(issuer)[:12]}…")
    expires, not_before = _number(claims.get("exp")), _number(claims.get("nbf"))
    if expires and now > expires:
        raise JwtError("JWT has expired")
    if not_before and now < not_before:
        raise JwtError("JWT is not valid yet")
    return claims


@dataclass(frozen=True, kw_only=True)
class AuthorizationRequest:
    """What nats-server asks the callout about one connecting client."""

    server_id: str
    """The asking server's public key: the audience of the response."""
    user_nkey: str
    """The key nats-server made for this connection: the subject of the response and of the user JWT."""
    client_name: str
    client_host: str
    token: str
    """`auth_token` of the client's CONNECT (an agent's Kubernetes ServiceAccount token)."""
    user: str


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def parse_request(token: str, *, now: float) -> AuthorizationRequest:
    """The request a server sent, checked: signed by a server key that is also its server id, of the request type,
    for the callout's audience, naming a user key. JwtError otherwise."""
    claims = decode(token, issuer_prefix=nkeys.Prefix.SERVER, now=now)
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != REQUEST_TYPE:
        raise JwtError(f"not an authorization request (type {nats.get('type') if isinstance(nats, dict) else None})")
    if claims.get("aud") != REQUEST_AUDIENCE:
        raise JwtError(f"authorization request audience is {claims.get('aud')!r}, not {REQUEST_AUDIENCE!r}")
    server = _object(nats.get("server_id"))
    server_id = _text(server.get("id"))
    if server_id != claims["iss"]:
        raise JwtError("authorization request not signed by the server it names")
    user_nkey = _text(nats.get("user_nkey"))
    if not nkeys.is_public(user_nkey, nkeys.Prefix.USER):
        raise JwtError("authorization request names no user key")
    client, connect = _object(nats.get("client_info")), _object(nats.get("connect_opts"))
    return AuthorizationRequest(
        server_id=server_id,
        user_nkey=user_nkey,
        client_name=_text(client.get("name")) or _text(connect.get("name")),
        client_host=_text(client.get("host")),
        token=_text(connect.get("auth_token")),
        user=_text(connect.get("user")),
    )


def jwt_permissions(permissions: Mapping[str, Any]) -> dict[str, Any]:
    """Server-config permissions ({"publish": {"allow": …}, "subscribe": …}, bus.auth) in a user JWT's shape
    ({"pub": …, "sub": …})."""
    renamed = {"publish": "pub", "subscribe": "sub"}
    return {renamed[k]: dict(v) for k, v in permissions.items() if k in renamed}


def user_jwt(
    request: AuthorizationRequest,
    *,
    issuer: nkeys.KeyPair,
    account: str,
    name: str,
    permissions: Mapping[str, Any],
    now: float,
) -> str:
    """The user the server registers for this connection: in `account`, shown as `name`, allowed `permissions`
    (server-config shape)."""
    claims = {
        "sub": request.user_nkey,
        "aud": account,
        "name": name,
        "nats": {
            **jwt_permissions(permissions),
            "subs": NO_LIMIT,
            "data": NO_LIMIT,
            "payload": NO_LIMIT,
            "type": USER_TYPE,
            "version": 2,
        },
    }
    return encode(claims, issuer, now=now)


def response(
    request: AuthorizationRequest, *, issuer: nkeys.KeyPair, now: float, user: str = "", error: str = ""
) -> str:
    """The callout's answer: the user JWT, or an error the server logs and refuses the client with."""
    if bool(user) == bool(error):
        raise ValueError("an authorization response carries a user JWT or an error, exactly one")
    nats: dict[str, Any] = {"type": RESPONSE_TYPE, "version": 2}
    nats["jwt" if user else "error"] = user or error
    return encode({"sub": request.user_nkey, "aud": request.server_id, "nats": nats}, issuer, now=now)

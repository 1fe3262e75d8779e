"""Who a request is: the gateway's client keys, their roles, and what each acts as upstream.

A client key has a role, ``admin`` or ``client``, and a store identity it acts as upstream:
the same key pair at the store (``"self"``: the store knows the key too), a pair of its own,
or the gateway's backend identity (``"backend"``: one identity for everyone, usually the
store's administrator). So the store's own permissions decide what each caller may read and
write, on pass-through and on pushdown alike. The credentials file (``--credentials-file``)
reads::

    {"keys": {
        "AKADMIN": {"secret": "...", "role": "admin"},
        "AKALICE": {"secret": "...", "upstream": "self"},
        "AKBOB":   {"secret": "...", "upstream": {"access_key_id": "...",
                                                  "secret_access_key": "..."}},
        "AKSOLO":  {"secret": "...", "upstream": "backend"}}}

``role`` defaults to ``client``. A client key names its ``upstream``: acting as the backend
identity is never a default, since that identity may do everything at the store. An admin
key acts as the backend identity unless it says otherwise. The older flat form
``{"KEY_ID": "SECRET", ...}`` still reads, for a single-tenant setup: every key a client
acting as the backend identity, as ``HAPI_ACCESS_KEY_ID`` is; ``hapi serve`` names such
keys when it starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hapi.protocol import Credentials

Role = Literal["admin", "client"]
ROLES: tuple[Role, ...] = ("admin", "client")
ANONYMOUS = "anonymous"  # the metering name of unsigned callers (never a valid key id)


@dataclass(frozen=True, slots=True)
class ClientKey:
    """One key clients may sign with.

    Attributes:
        secret: The key's secret (never in a ``repr``).
        role: ``admin`` may write the registry and use the cache bucket; ``client`` may not.
        upstream: The store identity its requests act as; ``None``: the backend identity.
    """

    secret: str = field(repr=False)
    role: Role = "client"
    upstream: Credentials | None = None


@dataclass(frozen=True, slots=True)
class Caller:
    """The identity one request acts as, resolved once at the edge.

    Attributes:
        name: The access key id it signed with (``anonymous`` for an unsigned request):
            what pushdown meters and shares fairly by.
        role: ``admin`` or ``client`` (an anonymous caller is a client).
        upstream: What its upstream requests are signed with; ``None``: sent unsigned, for
            the store's ACLs and bucket policies to judge.
    """

    name: str
    role: Role
    upstream: Credentials | None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @classmethod
    def anonymous(cls) -> Caller:
        return cls(ANONYMOUS, "client", None)


def caller_of(key_id: str, clients: Mapping[str, ClientKey], backend: Credentials) -> Caller:
    """The caller that signed with ``key_id`` (a key of ``clients``: it was verified)."""
    key = clients[key_id]
    return Caller(key_id, key.role, key.upstream or backend)


def read_credentials_file(path: Path) -> dict[str, ClientKey]:
    """The client keys of a credentials file (see the module's docstring for its form).

    Raises:
        ValueError: The file is unreadable, not JSON, or an entry is malformed (the
            message names the key, never a secret).
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read credentials file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"credentials file {path} must hold a JSON object")
    if "keys" not in data:  # the flat form: {"KEY_ID": "SECRET"}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise ValueError(
                f'credentials file {path} must be {{"keys": {{KEY_ID: {{"secret": ...}}}}}} '
                "or a flat JSON object of key id -> secret"
            )
        return {key_id: ClientKey(secret) for key_id, secret in data.items()}
    unknown = set(data) - {"keys"}
    if unknown or not isinstance(data["keys"], dict):
        raise ValueError(
            f'credentials file {path}: expected only "keys" (an object of key id -> entry), '
            f"found {sorted(unknown) or type(data['keys']).__name__}"
        )
    return {key_id: _entry(path, key_id, entry) for key_id, entry in data["keys"].items()}


def _entry(path: Path, key_id: str, entry: Any) -> ClientKey:
    where = f"credentials file {path}, key {key_id!r}"
    if not isinstance(entry, dict) or not isinstance(entry.get("secret"), str):
        raise ValueError(f'{where}: an entry needs "secret" (a string)')
    unknown = set(entry) - {"secret", "role", "upstream"}
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    role = entry.get("role", "client")
    if role not in ROLES:
        raise ValueError(f"{where}: role must be admin or client, not {role!r}")
    upstream = entry.get("upstream", "backend" if role == "admin" else None)
    if upstream is None:
        raise ValueError(
            f'{where}: a client key says which store identity it acts as: "upstream": "self" '
            '(the store knows this key), {"access_key_id": ..., "secret_access_key": ...}, '
            "or \"backend\" (the gateway's own identity, the store's administrator in most "
            "deployments)"
        )
    if upstream == "backend":
        return ClientKey(entry["secret"], role)
    if upstream == "self":
        return ClientKey(entry["secret"], role, Credentials(key_id, entry["secret"]))
    if (
        isinstance(upstream, dict)
        and set(upstream) == {"access_key_id", "secret_access_key"}
        and all(isinstance(v, str) and v for v in upstream.values())
    ):
        pair = Credentials(upstream["access_key_id"], upstream["secret_access_key"])
        return ClientKey(entry["secret"], role, pair)
    raise ValueError(
        f'{where}: upstream must be "self", "backend" or '
        '{"access_key_id": ..., "secret_access_key": ...}'
    )


def backend_actors(clients: Mapping[str, ClientKey]) -> list[str]:
    """The client keys (role ``client``) that act upstream as the backend identity."""
    return sorted(
        key_id for key_id, key in clients.items() if key.role == "client" and key.upstream is None
    )

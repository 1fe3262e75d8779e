"""An S3 access key pair, as every package that signs or accepts requests holds one."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key pair: what a client signs with, and what a store or gateway accepts.

    The secret never appears in a ``repr`` (settings and logs print credentials).
    """

    access_key_id: str
    secret_access_key: str = field(repr=False)

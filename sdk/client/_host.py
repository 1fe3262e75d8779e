"""Whether an endpoint runs on this machine (then both tiers share its cores)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def same_host(endpoint: str) -> bool:
    """Whether every address ``endpoint``'s host resolves to is this machine's: a loopback
    address, or one of the addresses of this host's own name.

    A gateway on the same machine as the training loop shares its CPU cores, so the cost
    model must not let storage and client compute overlap (``Profile.shared_compute``).
    An endpoint whose host cannot be resolved counts as remote.
    """
    host = urlsplit(endpoint).hostname
    if not host:
        return False
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    own = _own_addresses()
    return bool(addresses) and all(
        ipaddress.ip_address(address.split("%")[0]).is_loopback or address in own
        for address in addresses
    )


def _own_addresses() -> set[str]:
    try:
        return set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        return set()

"""Each pushdown request to the gateway beside its object's bytes.

A store spreads objects over storage nodes; a gateway on every storage node computes
features where the bytes are, if each request reaches the right one. The store's placement
lookup (:class:`hapi.protocol.Placement`) says which hosts hold an object's bytes;
:class:`Locality` matches those hosts to the client's endpoints (a gateway endpoint is
beside a storage node when its host is the node's). A store without a placement lookup
(AWS S3, MinIO's erasure sets) gets none, and requests are spread over the endpoints as
before. The lookup is chosen by a spec string (``client(placement=...)`` or
``HAPI_PLACEMENT``, see :func:`hapi.store.parse_placement`); a failed lookup never fails
a request: the object is then unplaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from hapi.protocol import Placement
from hapi.store import parse_placement

PLACEMENT_VARIABLE = "HAPI_PLACEMENT"


def resolve_placement(
    placement: str | Placement | None, environ: Mapping[str, str]
) -> Placement | None:
    """The argument (a spec or a placement), else :data:`PLACEMENT_VARIABLE`, else none."""
    if placement is None:
        placement = environ.get(PLACEMENT_VARIABLE, "")
    return parse_placement(placement) if isinstance(placement, str) else placement


class Locality:
    """Which endpoint is beside each object: a placement matched to the client's endpoints.

    Args:
        placement: The store's placement lookup.
        endpoints: The gateway endpoints; one whose host is a storage node's serves it.
    """

    def __init__(self, placement: Placement, endpoints: Sequence[str]) -> None:
        self.placement = placement
        self._by_host: dict[str, str] = {}
        for endpoint in endpoints:
            host = urlsplit(endpoint).hostname
            if host:
                self._by_host.setdefault(host, endpoint)

    def endpoint_for(self, bucket: str, key: str) -> str | None:
        """The endpoint beside the object's bytes, or ``None`` when none is known."""
        for host in self.placement.locate(bucket, key):
            endpoint = self._by_host.get(host)
            if endpoint is not None:
                return endpoint
        return None

    def group(self, bucket: str, keys: Sequence[str]) -> list[tuple[str | None, list[str]]]:
        """``keys`` grouped by the endpoint beside them, in order of first appearance; the
        keys of each group keep their order."""
        groups: dict[str | None, list[str]] = {}
        for key in keys:
            groups.setdefault(self.endpoint_for(bucket, key), []).append(key)
        return list(groups.items())

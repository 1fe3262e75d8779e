"""Where an object's bytes live: the interface of a store's placement lookup.

A store spreads objects over storage nodes. A *placement* answers, for ``(bucket, key)``,
which hosts hold the object's bytes (most bytes first), or nothing when it does not know.
The SDK sends each pushdown request to the gateway on such a host; a gateway counts the
objects it fetches from another node. The lookups themselves ask the store over HTTP, so
they live with the store code (:func:`hapi.store.parse_placement`); this is only their shape.
"""

from __future__ import annotations

from typing import Protocol


class Placement(Protocol):
    """A store's answer to "which hosts hold this object's bytes"."""

    def locate(self, bucket: str, key: str) -> tuple[str, ...]:
        """Hosts holding the object's bytes, most bytes first; empty when unknown."""
        ...

    def forget(self, bucket: str, key: str) -> None:
        """Drop what is cached for the object (it moved, or its node failed)."""
        ...

    def close(self) -> None:
        """Release what the lookup holds (its connections)."""
        ...

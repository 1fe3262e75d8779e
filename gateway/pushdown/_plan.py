"""``split=auto``: where pushdown cuts a model when the client leaves it to the gateway."""

from __future__ import annotations

from hapi import planner
from hapi.models import Manifest
from hapi.protocol import StorageProfile

from .._errors import InsufficientMemory
from ._batcher import MemoryBudget
from ._params import Params

__all__ = ["choose_split"]


def choose_split(
    manifest: Manifest,
    params: Params,
    budget: MemoryBudget,
    assumed_bandwidth_bps: float,
    storage: StorageProfile,
) -> int:
    """``split=auto``: the planner's best split on the gateway's view: its own measured
    block, decode and availability figures (``storage``, the manifest's where nothing
    ran), its memory share and load; the client's bandwidth from ``x-hapi-bandwidth``,
    else the configured assumption; a client on this machine shares its cores. Raw
    objects are priced but not chosen: the client asked for features. The planner's
    rule on bytes holds here too: a split sending more bytes than a raw object must be
    clearly faster than one that does not (more so on one machine). An answer in the
    ``zeros`` encoding is priced without the zero values the manifest counted on the
    export's photos (dense where it predates that count).
    """
    view = planner.GatewayProfile(
        model=manifest.ref,
        cpu_ms=tuple(block.cpu_ms for block in manifest.blocks[: manifest.freeze]),
        storage=storage,
        memory_bytes=budget.share(),
        busy_tenants=max(0, budget.active_tenants - 1),
    )
    profile = view.apply(
        planner.profile_from_manifest(
            manifest,
            wire_dtype=params.dtype,
            shared_compute=params.colocated,
            zeros=manifest.zeros if params.encoding == "zeros" else None,
        )
    )
    bandwidth = params.bandwidth_bps or assumed_bandwidth_bps
    try:
        chosen = planner.plan(manifest, profile, bandwidth, features_only=True)
    except planner.NoFeasibleSplit:
        raise InsufficientMemory(
            f"no split of {manifest.ref} fits the storage side's memory budget"
        ) from None
    assert chosen.split is not None
    return chosen.split

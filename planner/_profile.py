"""What the cost model knows of a model on both sides: a :class:`Profile`, from a manifest's
export-time figures or from times measured elsewhere (the SDK measures the client side,
the gateway its own); nothing here measures.

A manifest records each block's output bytes, peak activation bytes, weights and CPU time
per sample on the exporting machine; :func:`profile_from_manifest` assumes those times
for both sides unless measured ones are given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hapi.models import Manifest
from hapi.protocol import WIRE_ITEMSIZE, zeros_share

from ._errors import InvalidInput

DEFAULT_RAW_BYTES = 110_000
"""Mean bytes of one ImageNet JPEG (they range over about 50-150 KB)."""
DEFAULT_DECODE_MS = 10.0
"""Decoding and preprocessing one ImageNet-sized JPEG with Pillow on one CPU core."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """What the cost model knows about a model on both sides; per-block tuples cover the
    frozen blocks ``[0, freeze)``, times are milliseconds per sample, sizes are bytes.

    Args:
        storage_ms: Per-block compute time on the storage side, with the device idle.
        client_ms: Per-block compute time on the client.
        output_bytes: Per-block output bytes of one sample (what split ``k`` sends is
            block ``k - 1``'s).
        peak_activation_bytes: Per-block peak activation bytes of one sample.
        weight_bytes: Per-block weight bytes (held once per side, whatever the batch).
        input_bytes: Bytes of one preprocessed sample (what split 0 sends).
        raw_bytes: Mean bytes of one raw object per sample (what no pushdown sends).
        storage_decode_ms: Decode and preprocess time on the storage side.
        client_decode_ms: Decode and preprocess time on the client.
        head_ms: The trainable head's training step (forward, backward, update) on the client.
        client_request_ms: The client's CPU time per HTTP request (signing, sending,
            parsing the answer), whatever its size: no pushdown makes one GET per
            object, pushdown one request per batch.
        head_memory_bytes: Client memory the head's training needs beyond the frozen blocks.
        storage_memory_bytes: The storage side's memory budget; ``None`` for unlimited.
        client_memory_bytes: The client's memory budget; ``None`` for unlimited.
        storage_load: Factor on the storage stage's time: 1 as profiled, ``n`` when its
            device is time-shared in turn with ``n - 1`` busy tenants.
        storage_available: The share of a core the storage side gets on its host
            (``0 < available <= 1``; measured by the gateway): the storage stage is
            divided by it, except with ``shared_compute``, where what takes the rest
            of the core is largely the client itself, which pays the same.
        storage_origin: Where the storage-side figures came from and how old they are,
            in words (for the explanation); empty when not from a gateway.
        storage_batch: The batch the storage side must fit at least. The gateway sizes
            its batches to its memory, so 1 by default.
        wire_dtype: The dtype the features travel in (what ``output_bytes`` and
            ``input_bytes`` are counted in).
        shared_compute: Both tiers run on one machine's cores (gateway and client on
            the same host), so storage and client compute take turns instead of
            overlapping.
        readers_in_turn: How many readers fetch the job's batches when each requests a
            batch, waits for it and computes on it before it requests the next (the
            map-style ``FeatureDataset``, one reader per DataLoader worker): at most
            that many batches are on their way or computing at once, so a batch takes
            at least its three stages' sum over them. ``None``: requests are sent ahead
            of the compute (the iterable form's prefetch), and the stages overlap.
        zeros: Per-block share of the output's values that are zero, measured on real
            samples, when the features travel in the ``zeros`` encoding (which leaves
            them out): what split ``k`` sends is priced at block ``k - 1``'s share of
            its bytes. ``None``: dense answers, or not measured.
    """

    storage_ms: tuple[float, ...]
    client_ms: tuple[float, ...]
    output_bytes: tuple[int, ...]
    peak_activation_bytes: tuple[int, ...]
    weight_bytes: tuple[int, ...]
    input_bytes: int
    raw_bytes: float
    storage_decode_ms: float
    client_decode_ms: float
    head_ms: float = 0.0
    client_request_ms: float = 0.0
    head_memory_bytes: int = 0
    storage_memory_bytes: int | None = None
    client_memory_bytes: int | None = None
    storage_load: float = 1.0
    storage_available: float = 1.0
    storage_batch: int = 1
    wire_dtype: str = "float32"
    shared_compute: bool = False
    storage_origin: str = ""
    readers_in_turn: int | None = None
    zeros: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        blocks = (
            self.storage_ms,
            self.client_ms,
            self.output_bytes,
            self.peak_activation_bytes,
            self.weight_bytes,
        )
        if len({len(values) for values in blocks}) != 1:
            raise InvalidInput("profile: the per-block tuples must have one entry per block")
        scalars = (
            self.input_bytes,
            self.raw_bytes,
            self.storage_decode_ms,
            self.client_decode_ms,
            self.head_ms,
            self.client_request_ms,
            self.head_memory_bytes,
        )
        if min((*scalars, *(v for values in blocks for v in values))) < 0:
            raise InvalidInput("profile: times and sizes must be >= 0")
        if not 0 < self.storage_load < math.inf or self.storage_batch < 1:
            raise InvalidInput("profile: storage_load must be > 0 and storage_batch >= 1")
        if not 0 < self.storage_available <= 1:
            raise InvalidInput("profile: storage_available must be in (0, 1]")
        for budget in (self.storage_memory_bytes, self.client_memory_bytes):
            if budget is not None and budget <= 0:
                raise InvalidInput("profile: memory budgets must be positive (or None)")
        if self.readers_in_turn is not None and self.readers_in_turn < 1:
            raise InvalidInput("profile: readers_in_turn must be >= 1 (or None)")
        if self.zeros is not None and (
            len(self.zeros) != len(self.storage_ms) or not all(0 <= z <= 1 for z in self.zeros)
        ):
            raise InvalidInput("profile: zeros must be one share in [0, 1] per block")
        if self.wire_dtype not in WIRE_ITEMSIZE:
            raise InvalidInput(f"profile: unknown wire dtype {self.wire_dtype!r}")

    def in_dtype(self, dtype: str) -> Profile:
        """The same profile with features sent in ``dtype`` (their bytes rescaled)."""
        scale = WIRE_ITEMSIZE[dtype] / WIRE_ITEMSIZE[self.wire_dtype]
        return replace(
            self,
            output_bytes=tuple(math.ceil(b * scale) for b in self.output_bytes),
            input_bytes=math.ceil(self.input_bytes * scale),
            wire_dtype=dtype,
        )

    @property
    def blocks(self) -> int:
        """How many blocks the profile covers."""
        return len(self.storage_ms)

    def bytes_at(self, split: int | None) -> float:
        """Bytes one sample sends over the network at ``split`` (``None``: no pushdown)."""
        if split is None:
            return self.raw_bytes
        return self.input_bytes if split == 0 else self.output_bytes[split - 1]

    def sent_at(self, split: int | None) -> float:
        """Bytes one sample's answer carries over the network at ``split``: its features'
        bytes less the zero words the ``zeros`` encoding leaves out (with :attr:`zeros`),
        the raw object without pushdown."""
        dense = self.bytes_at(split)
        if split is None or split == 0 or self.zeros is None:
            return dense
        return dense * zeros_share(self.zeros[split - 1], WIRE_ITEMSIZE[self.wire_dtype])

    def activation_bytes(self, start: int, stop: int) -> int:
        """Memory one sample needs through blocks ``[start, stop)``: its input, or a block's
        input and output alive together, or a block's own peak, whichever is largest
        (the gateway's estimate, so both sides agree)."""
        held = int(self.bytes_at(start))
        need = held
        for index in range(start, stop):
            output = self.output_bytes[index]
            need = max(need, held + output, self.peak_activation_bytes[index])
            held = output
        return need


def profile_from_manifest(
    manifest: Manifest,
    *,
    storage_ms: Sequence[float] | None = None,
    client_ms: Sequence[float] | None = None,
    raw_bytes: float = DEFAULT_RAW_BYTES,
    storage_decode_ms: float = DEFAULT_DECODE_MS,
    client_decode_ms: float = DEFAULT_DECODE_MS,
    head_ms: float = 0.0,
    client_request_ms: float = 0.0,
    head_memory_bytes: int = 0,
    storage_memory_bytes: int | None = None,
    client_memory_bytes: int | None = None,
    storage_load: float = 1.0,
    wire_dtype: str | None = None,
    shared_compute: bool = False,
    zeros: Sequence[float] | None = None,
) -> Profile:
    """A profile of ``manifest``'s frozen blocks, with the manifest's ``cpu_ms`` for both
    sides unless measured times are given.

    Args:
        manifest: The model.
        storage_ms: Per-block storage-side ms per sample (e.g. from
            :meth:`GatewayProfile.storage_ms`); the manifest's ``cpu_ms`` if omitted.
        client_ms: Per-block client ms per sample (e.g. from
            :func:`measure_client_blocks`); the manifest's ``cpu_ms`` if omitted.
        raw_bytes: Mean object bytes per sample.
        storage_decode_ms: Decode and preprocess ms per sample on the storage side.
        client_decode_ms: The same on the client (see :func:`measure_decode_ms`).
        head_ms: The head's training step, ms per sample.
        client_request_ms: The client's CPU time per request (see
            :func:`measure_request_ms`); 0 leaves requests unpriced.
        head_memory_bytes: Client memory the head's training needs.
        storage_memory_bytes: The storage side's budget; ``None`` for unlimited.
        client_memory_bytes: The client's budget; ``None`` for unlimited.
        storage_load: Factor on storage-side time for a shared device.
        wire_dtype: The ``x-hapi-dtype`` features travel in (``float16`` halves float32
            bytes); the blocks' own dtype if omitted.
        shared_compute: Both tiers run on the same machine's cores (see
            :attr:`Profile.shared_compute`).
        zeros: Per-block share of zero values, for answers in the ``zeros`` encoding
            (see :attr:`Profile.zeros`); ``None``: priced dense.

    Raises:
        InvalidInput: A per-block sequence of the wrong length, an unknown dtype, or a
            negative figure.
    """
    frozen = manifest.blocks[: manifest.freeze]
    scale = _wire_scale(manifest, wire_dtype)
    return Profile(
        storage_ms=_per_block(storage_ms, manifest, "storage_ms"),
        client_ms=_per_block(client_ms, manifest, "client_ms"),
        output_bytes=tuple(math.ceil(b.output_bytes * scale) for b in frozen),
        peak_activation_bytes=tuple(b.peak_activation_bytes for b in frozen),
        weight_bytes=tuple(b.size for b in frozen),
        input_bytes=math.ceil(_input_bytes(manifest) * scale),
        raw_bytes=raw_bytes,
        storage_decode_ms=storage_decode_ms,
        client_decode_ms=client_decode_ms,
        head_ms=head_ms,
        client_request_ms=client_request_ms,
        head_memory_bytes=head_memory_bytes,
        storage_memory_bytes=storage_memory_bytes,
        client_memory_bytes=client_memory_bytes,
        storage_load=storage_load,
        wire_dtype=wire_dtype or manifest.input.dtype,
        shared_compute=shared_compute,
        zeros=None if zeros is None else tuple(_per_block(zeros, manifest, "zeros")),
    )


def _per_block(values: Sequence[float] | None, manifest: Manifest, what: str) -> tuple[float, ...]:
    if values is None:
        return tuple(block.cpu_ms for block in manifest.blocks[: manifest.freeze])
    if len(values) < manifest.freeze:
        raise InvalidInput(
            f"{what} has {len(values)} entries; {manifest.ref} has {manifest.freeze} frozen blocks"
        )
    return tuple(float(v) for v in values[: manifest.freeze])


def _itemsize(dtype: str) -> int:
    try:
        return WIRE_ITEMSIZE[dtype]
    except KeyError:
        raise InvalidInput(f"unknown dtype {dtype!r}; known: {', '.join(WIRE_ITEMSIZE)}") from None


def _input_bytes(manifest: Manifest) -> int:
    return int(math.prod(manifest.input.shape)) * _itemsize(manifest.input.dtype)


def _wire_scale(manifest: Manifest, wire_dtype: str | None) -> float:
    if wire_dtype is None:
        return 1.0
    return _itemsize(wire_dtype) / _itemsize(manifest.input.dtype)

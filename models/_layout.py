"""Checking and composing a manifest's stored blocks (the keys are ``hapi.protocol``'s)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from ._errors import CorruptBlock
from ._manifest import Manifest
from ._onnx import compose, sha256


def check_block(manifest: Manifest, index: int, data: bytes | None) -> bytes:
    """``data`` if it is block ``index`` of ``manifest`` (its bytes hash to the digest).

    Raises:
        CorruptBlock: The block is missing (``None``) or its bytes do not match.
    """
    expected = manifest.blocks[index].hash
    actual = "missing" if data is None else sha256(data)
    if data is None or actual != expected:
        raise CorruptBlock(manifest.ref, index, expected, actual)
    return data


def assemble_blocks(
    manifest: Manifest, start: int, blobs: Sequence[bytes | None]
) -> onnx.ModelProto:
    """Verify the stored bytes of blocks ``[start, start + len(blobs))`` and compose them
    into one graph (input ``input``, output ``output``, dynamic batch dimension).

    Raises:
        CorruptBlock: A block fails verification; nothing is composed.
    """
    verified = [check_block(manifest, start + i, blob) for i, blob in enumerate(blobs)]
    return compose([onnx.load_from_string(blob) for blob in verified])

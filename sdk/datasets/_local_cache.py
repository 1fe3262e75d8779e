"""The client-side feature cache (``local_cache="DIR"``): post-freeze features kept on the
training machine, so that epoch 2 and later cross no network at all.

An entry holds one object's rows of features at the freeze point (float32, as the head
sees them) and the labels its samples carried. Its name hashes what the rows depend on:
the bucket and key, the object's ETag when the dataset listed it (``from_prefix``,
``from_shards`` of a prefix; explicitly named objects are taken as unchanged), the
preprocessing preset, the content hashes of blocks ``[0, freeze)``, the split and the
wire dtype (which round the features a little differently). Entries are written to a
temporary file and renamed into place, so a reader never sees a partial one; an entry
that cannot be read is a miss. Several DataLoader workers may share the directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import numpy as np

from hapi.models import Manifest
from hapi.protocol import decode_features, encode_features

logger = logging.getLogger("hapi.sdk")


class LocalCache:
    """Entries under ``root``, for one model, freeze point, split and dtype.

    Args:
        root: The directory (created when missing).
        manifest: The model.
        freeze: Features are blocks ``[0, freeze)``'s output.
        split: The split that computes them (``None``: no pushdown).
        dtype: The wire dtype.
        etags: ETags by object key, when the objects were listed.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        freeze: int,
        split: int | None,
        dtype: str,
        etags: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._etags = etags or {}
        self._warned = False
        self._scope = json.dumps(
            {
                "preprocess": asdict(manifest.preprocess),
                "blocks": list(manifest.hashes[:freeze]),
                "split": split,
                "dtype": dtype if split is not None else "float32",
            },
            sort_keys=True,
            default=list,
        )

    def _path(self, bucket: str, key: str) -> Path:
        material = json.dumps([self._scope, bucket, key, self._etags.get(key, "")])
        digest = hashlib.sha256(material.encode()).hexdigest()
        return self.root / digest[:2] / f"{digest}.safetensors"

    def holds(self, bucket: str, key: str) -> bool:
        """Whether the object has an entry (one stat; :meth:`get` may still miss it)."""
        return self._path(bucket, key).is_file()

    def get(self, bucket: str, key: str) -> tuple[np.ndarray, list[int | None]] | None:
        """The object's rows and carried labels, or ``None`` on a miss."""
        try:
            tensors, _ = decode_features(self._path(bucket, key).read_bytes())
            rows = np.array(tensors["features"], dtype=np.float32)
            carried = [None if label < 0 else int(label) for label in tensors["labels"]]
        except (OSError, ValueError, KeyError):
            return None
        return (rows, carried) if len(carried) == len(rows) else None

    def put(self, bucket: str, key: str, rows: np.ndarray, carried: list[int | None]) -> None:
        """Keep an object's rows; a failure to write only loses the entry."""
        path = self._path(bucket, key)
        labels = np.array([-1 if c is None else c for c in carried], dtype=np.int64)
        body = encode_features(rows, dtype="float32", labels=labels)
        try:
            path.parent.mkdir(exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
                tmp.write(body)
            os.replace(tmp.name, path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("the local feature cache %s cannot be written: %s", self.root, exc)

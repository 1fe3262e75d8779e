"""What a dataset reads: ``s3://`` URIs, object listings, and label sources.

Label sources are small named strategies (:data:`LABEL_SOURCES`), resolved once when a
dataset is built, into a picklable :class:`Labels` value every worker shares:

- ``folder``: the object's parent folder names its class (torchvision's ImageFolder
  convention, ``train/cat/001.jpg`` is a ``cat``); classes sorted, numbered from 0.
- ``manifest:s3://bucket/labels.csv`` (columns ``key`` and ``label``, with a header row)
  or ``manifest:s3://bucket/labels.jsonl`` (``{"key": ..., "label": ...}`` per line); keys
  are full object keys or relative to the dataset's prefix; labels integers or names.
- ``cls``: the ``.cls`` member of each sample of a WebDataset shard.
- ``none``: no labels (every label is ``-1``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from ._errors import LabelError, RequestError, request_error

logger = logging.getLogger("hapi.sdk")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
SHARD_SUFFIXES = (".tar",)
UNLABELED = -1


def parse_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` into bucket and key.

    Raises:
        ValueError: Not an ``s3://`` URI with a bucket.
    """
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"expected s3://bucket/key, not {uri!r}")
    return parts.netloc, parts.path.lstrip("/")


def same_bucket(uris: Iterable[str]) -> tuple[str, list[str]]:
    """The one bucket of several ``s3://`` URIs, and their keys in order.

    Raises:
        ValueError: No URIs, or URIs in more than one bucket.
    """
    pairs = [parse_uri(uri) for uri in uris]
    buckets = {bucket for bucket, _ in pairs}
    if len(buckets) != 1:
        found = ", ".join(sorted(buckets)) or "none"
        raise ValueError(f"a dataset's objects must be in one bucket; found: {found}")
    return pairs[0][0], [key for _, key in pairs]


def list_objects(
    s3: Any, bucket: str, prefix: str, suffixes: Sequence[str]
) -> list[tuple[str, int, str]]:
    """Keys (sorted), sizes and ETags of the objects under ``prefix`` whose names end in a
    suffix.

    Raises:
        RequestError: The listing failed (e.g. ``NoSuchBucket``).
        ValueError: Nothing matched.
    """
    found: list[tuple[str, int, str]] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                if item["Key"].lower().endswith(tuple(suffixes)):
                    etag = str(item.get("ETag", "")).strip('"')
                    found.append((item["Key"], int(item.get("Size", 0)), etag))
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise request_error(
            str(error.get("Code", "Unknown")), str(error.get("Message", "")), bucket=bucket
        ) from exc
    except BotoCoreError as exc:
        raise RequestError("NetworkError", str(exc), bucket=bucket) from exc
    if not found:
        raise ValueError(f"no {'/'.join(suffixes)} objects under s3://{bucket}/{prefix}")
    return sorted(found)


SIZE_SAMPLES = 8
"""Objects a planner HEADs for their mean size when no listing gave the sizes."""


def sampled_object_bytes(s3: Any, bucket: str, keys: Sequence[str]) -> float | None:
    """The mean size of up to :data:`SIZE_SAMPLES` of ``keys``, spread evenly over them
    (a HEAD each): what raw reads cost per sample when the objects were named, not
    listed. ``None`` when none could be read (the caller then assumes a default)."""
    if not keys:
        return None
    sizes, failure = [], None
    for key in keys[:: max(1, len(keys) // SIZE_SAMPLES)][:SIZE_SAMPLES]:
        try:
            sizes.append(int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"]))
        except (ClientError, BotoCoreError) as exc:
            failure = exc  # the object's own request fails later, with its own error
    if not sizes:
        logger.warning(
            "planning with a default object size: no HEAD of s3://%s answered (%s)", bucket, failure
        )
        return None
    return sum(sizes) / len(sizes)


@dataclass(frozen=True)
class Labels:
    """Labels of a dataset's objects, resolved once and shared by every worker.

    Args:
        by_key: Label of each object key; ``None`` when labels come with the samples.
        classes: Class names by index (empty when the labels were integers already).
        from_samples: Take the label each sample carries (a shard's ``.cls``).
    """

    by_key: Mapping[str, int] | None = None
    classes: tuple[str, ...] = ()
    from_samples: bool = False

    def label(self, key: str, carried: int | None = None) -> int:
        """The label of object ``key``; ``carried`` is the sample's own, if any."""
        if self.from_samples:
            return UNLABELED if carried is None else carried
        if self.by_key is None:
            return UNLABELED
        return self.by_key[key]


LabelSource = Callable[[Any, str, str, Sequence[str], str], Labels]


def _numbered(names: Mapping[str, str]) -> Labels:
    values = set(names.values())
    if all(value.lstrip("-").isdigit() for value in values):
        return Labels(by_key={key: int(value) for key, value in names.items()})
    classes = tuple(sorted(values))
    index = {name: i for i, name in enumerate(classes)}
    return Labels(by_key={key: index[value] for key, value in names.items()}, classes=classes)


def _folder(_s3: Any, bucket: str, _prefix: str, keys: Sequence[str], _arg: str) -> Labels:
    unfiled = [key for key in keys if "/" not in key]
    if unfiled:
        raise LabelError(
            f"labels='folder' needs each object in a class folder; s3://{bucket}/{unfiled[0]} "
            "is in none"
        )
    return _numbered({key: key.rsplit("/", 2)[-2] for key in keys})


def _manifest(s3: Any, bucket: str, prefix: str, keys: Sequence[str], arg: str) -> Labels:
    uri = arg.removeprefix("manifest:")
    table = _read_table(s3, uri)
    names: dict[str, str] = {}
    for key in keys:
        found = table.get(key, table.get(key.removeprefix(prefix)))
        if found is None:
            raise LabelError(f"{uri} has no label for s3://{bucket}/{key}")
        names[key] = found
    return _numbered(names)


def _read_table(s3: Any, uri: str) -> dict[str, str]:
    bucket, key = parse_uri(uri)
    try:
        text = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise request_error(
            str(error.get("Code", "Unknown")), str(error.get("Message", "")), bucket=bucket, key=key
        ) from exc
    except BotoCoreError as exc:
        raise RequestError("NetworkError", str(exc), bucket=bucket, key=key) from exc
    try:
        if key.endswith(".jsonl"):
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        elif key.endswith(".csv"):
            rows = list(csv.DictReader(io.StringIO(text)))
        else:
            raise ValueError("a label manifest is a .csv or a .jsonl file")
        return {str(row["key"]): str(row["label"]) for row in rows}
    except (ValueError, KeyError, TypeError) as exc:
        raise LabelError(f"unreadable label manifest {uri}: {exc} (need key and label)") from exc


def _cls(_s3: Any, _bucket: str, _prefix: str, _keys: Sequence[str], _arg: str) -> Labels:
    return Labels(from_samples=True)


def _none(_s3: Any, _bucket: str, _prefix: str, _keys: Sequence[str], _arg: str) -> Labels:
    return Labels()


LABEL_SOURCES: Mapping[str, LabelSource] = {
    "folder": _folder,
    "manifest": _manifest,
    "cls": _cls,
    "none": _none,
}


def resolve_labels(
    spec: str | Callable[[str], int] | None,
    s3: Any,
    bucket: str,
    prefix: str,
    keys: Sequence[str],
) -> Labels:
    """Resolve a dataset's ``labels=`` argument into :class:`Labels`.

    Args:
        spec: A name from :data:`LABEL_SOURCES` (``manifest:URI`` for a manifest), a
            function of the object key, or ``None`` for no labels.
        s3: The client, to read a manifest.
        bucket: The dataset's bucket.
        prefix: The dataset's prefix (manifest keys may be relative to it).
        keys: Every object key of the dataset.

    Raises:
        ValueError: An unknown source; the message lists the known ones.
        LabelError: An object without a label.
    """
    if spec is None:
        return Labels()
    if callable(spec):
        return _numbered({key: str(spec(key)) for key in keys})
    name = spec.split(":", 1)[0]
    if name not in LABEL_SOURCES or (name == "manifest") != spec.startswith("manifest:"):
        known = ", ".join(f"{n}:s3://..." if n == "manifest" else n for n in LABEL_SOURCES)
        raise ValueError(f"unknown labels={spec!r}; known: {known}, or a function of the key")
    return LABEL_SOURCES[name](s3, bucket, prefix, keys, spec)

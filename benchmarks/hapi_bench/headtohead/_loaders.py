"""The four ways the job reads its data, each a torch ``DataLoader`` yielding batches of
``(features [B, ...], labels [B])`` at the freeze point.

- ``s3torch``: AWS's s3torchconnector (``S3MapDataset.from_objects``, the CRT client)
  against the store itself; its DataLoader workers read and decode each object
  (PIL, as torchvision's own image datasets do) and apply the torchvision transforms equal
  to the model's preprocessing preset; the main process runs the frozen blocks
  ``[0, freeze)`` in onnxruntime on the batch, as a user's training loop would.
- ``s3torch-gateway``: the same loader through hapi's gateway in pass-through.
- ``hapi``: ``hapi.sdk.FeatureDataset(split="auto")`` against the gateway without the
  feature cache.
- ``hapi-cache``: the same against the gateway with the feature cache, at the freeze point
  by default (``cache_split="auto"`` for the planner's pick): the planner prices a cold
  epoch and does not count the cache, so its pick (often raw objects) leaves the cache
  nothing to keep, while a job that means to run several epochs asks for the features it
  trains on, which the cache then keeps whole.

Every loader has the same batch size, workers, prefetch and sampler: a seeded permutation
per epoch (:class:`EpochSampler`), so for one seed and epoch all four read the same
objects in the same order. The DataLoader settings follow s3torchconnector's advice for
many small objects: map-style dataset, several workers, batches prefetched per worker,
workers kept across epochs.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from hapi.models import Manifest, Preset, Registry, RuntimeSettings, create_session
from hapi_bench.testbed._data import CLASSES

S3TORCH = "s3torch"
S3TORCH_GATEWAY = "s3torch-gateway"
HAPI = "hapi"
HAPI_CACHE = "hapi-cache"
CONFIGS = (S3TORCH, S3TORCH_GATEWAY, HAPI, HAPI_CACHE)
CONTENDERS = (S3TORCH, S3TORCH_GATEWAY)
RUNTIME = RuntimeSettings(device="cpu", intra_op_threads=1, inter_op_threads=1)
REGION = "us-east-1"
FOLDERS = tuple(sorted(CLASSES))
"""Class folders in torchvision's ``ImageFolder`` order (sorted), as hapi's
``labels="folder"`` numbers them."""


def label_of(key: str) -> int:
    """The class index of ``images/<class>/<n>.jpg``, in ``ImageFolder`` order."""
    return FOLDERS.index(key.split("/")[-2])


@dataclass(frozen=True, kw_only=True)
class LoaderSettings:
    """What every loader shares.

    Args:
        bucket: The objects' bucket.
        keys: The training objects, in index order.
        batch_size: Training batch (and hapi's request size).
        workers: DataLoader workers.
        prefetch_factor: Batches each worker keeps ahead.
        seed: The sampler's seed.
        dtype: hapi's wire dtype (the features the head trains on are float32 either way).
        encoding: hapi's answers' encoding (``zeros`` or ``dense``).
    """

    bucket: str
    keys: tuple[str, ...]
    batch_size: int = 16
    workers: int = 2
    prefetch_factor: int = 4
    seed: int = 0
    dtype: str = "float32"
    encoding: str = "zeros"

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.workers < 0 or self.prefetch_factor < 1:
            raise ValueError("batch_size and prefetch_factor must be >= 1, workers >= 0")


class EpochSampler:
    """A seeded permutation of ``range(length)`` per epoch (``set_epoch`` as
    ``DistributedSampler`` has), drawn in the main process, so workers kept across
    epochs do not change it. ``limit`` cuts a pass short (the warm-up's: a pass read to
    its end leaves no prefetched batch running into the next configuration's epoch)."""

    def __init__(self, length: int, seed: int) -> None:
        self.length, self.seed, self.epoch = length, seed, 0
        self.limit: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """The permutation of the next pass."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        return iter(epoch_order(self.length, self.seed, self.epoch)[: self.limit])


def epoch_order(length: int, seed: int, epoch: int) -> list[int]:
    """The indices of one epoch: a permutation seeded by ``(seed, epoch)``."""
    rng = np.random.default_rng([seed, epoch])
    return [int(i) for i in rng.permutation(length)]


def transforms(preset: Preset) -> Any:
    """torchvision's transforms equal to ``preset`` (hapi's preprocessing follows
    torchvision's ``Resize(int)`` and ``CenterCrop`` arithmetic)."""
    from torchvision import transforms as T

    interpolation = {
        "bilinear": T.InterpolationMode.BILINEAR,
        "bicubic": T.InterpolationMode.BICUBIC,
        "nearest": T.InterpolationMode.NEAREST,
    }[preset.interpolation]
    return T.Compose(
        [
            T.Resize(preset.resize, interpolation=interpolation),
            T.CenterCrop(preset.crop),
            T.ToTensor(),
            T.Normalize(list(preset.mean), list(preset.std)),
        ]
    )


@dataclass
class DecodeImage:
    """s3torchconnector's ``transform``: object bytes to ``(image tensor, label)``, in
    the worker (picklable: the transforms are built there, on first use)."""

    preset: Preset
    _transform: Any = field(default=None, repr=False)

    def __call__(self, reader: Any) -> tuple[Any, int]:
        from PIL import Image

        if self._transform is None:
            self._transform = transforms(self.preset)
        image = Image.open(io.BytesIO(reader.read())).convert("RGB")
        return self._transform(image), label_of(reader.key)


class FrozenBlocks:
    """Blocks ``[0, freeze)`` in onnxruntime: images in, features out (the contender's
    client-side compute)."""

    def __init__(self, registry: Registry, manifest: Manifest) -> None:
        graph = registry.load_blocks(manifest, 0, manifest.freeze)
        self._session = create_session(graph, RUNTIME)
        self._input = self._session.get_inputs()[0].name

    def __call__(self, images: Any) -> Any:
        import torch

        out = self._session.run(None, {self._input: images.numpy()})[0]
        return torch.from_numpy(np.asarray(out))


def _loader(dataset: Any, settings: LoaderSettings, sampler: EpochSampler) -> Any:
    from torch.utils.data import DataLoader

    workers = settings.workers
    return DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=sampler,
        num_workers=workers,
        prefetch_factor=settings.prefetch_factor if workers else None,
        persistent_workers=workers > 0,
    )


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """An S3 endpoint and the profile (in the credentials file) that signs for it."""

    url: str
    profile: str


def credentials_file(path: Path, profiles: dict[str, tuple[str, str]]) -> Path:
    """Write an AWS shared credentials file (the CRT client reads profiles from it)."""
    lines = []
    for name, (key, secret) in profiles.items():
        lines += [f"[{name}]", f"aws_access_key_id = {key}", f"aws_secret_access_key = {secret}"]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


class Loader:
    """One configuration's DataLoader and what turns its batches into features.

    Iterating gives ``(features, labels)`` per batch for the epoch set with
    :meth:`set_epoch`.
    """

    def __init__(self, name: str, loader: Any, sampler: EpochSampler, blocks: Any = None):
        self.name, self.loader, self.sampler, self._blocks = name, loader, sampler, blocks

    def set_epoch(self, epoch: int) -> None:
        """The permutation of the next pass; a dataset with epochs (hapi's) is told too,
        as a training loop tells it."""
        self.sampler.set_epoch(epoch)
        set_dataset_epoch = getattr(self.loader.dataset, "set_epoch", None)
        if set_dataset_epoch is not None:
            set_dataset_epoch(epoch)

    def warm(self, batch_size: int, workers: int) -> None:
        """Start the workers and load the sessions: a pass of one batch per worker, of an
        epoch never measured, read to its end."""
        self.sampler.set_epoch(0)
        self.sampler.limit = batch_size * max(1, workers)
        try:
            for _ in self:
                pass
        finally:
            self.sampler.limit = None

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for inputs, labels in self.loader:
            yield (inputs if self._blocks is None else self._blocks(inputs)), labels

    @property
    def dataset(self) -> Any:
        """The DataLoader's dataset."""
        return self.loader.dataset

    def close(self) -> None:
        """Stop the workers (a persistent iterator holds them)."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
            self.loader._iterator = None


def s3torch_loader(
    name: str, endpoint: Endpoint, settings: LoaderSettings, manifest: Manifest, blocks: Any
) -> Loader:
    """s3torchconnector's map dataset at ``endpoint``, path-style addressing."""
    from s3torchconnector import S3ClientConfig, S3MapDataset

    dataset = S3MapDataset.from_objects(
        [f"s3://{settings.bucket}/{key}" for key in settings.keys],
        region=REGION,
        endpoint=endpoint.url,
        transform=DecodeImage(manifest.preprocess),
        s3client_config=S3ClientConfig(force_path_style=True, profile=endpoint.profile),
    )
    sampler = EpochSampler(len(settings.keys), settings.seed)
    return Loader(name, _loader(dataset, settings, sampler), sampler, blocks)


def hapi_loader(
    name: str,
    endpoint: str,
    client_options: dict[str, Any],
    settings: LoaderSettings,
    manifest: Manifest,
    bandwidth: float | None,
    split: int | Literal["auto"] = "auto",
) -> Loader:
    """``FeatureDataset(split=split)`` at the gateway ``endpoint``; ``bandwidth`` is the
    link's rate when known, a hint (else, for ``"auto"``, the build samples the link on
    the object it reads to time the client, and the job's responses measure it)."""
    from hapi import sdk

    dataset = sdk.FeatureDataset.from_objects(
        [f"s3://{settings.bucket}/{key}" for key in settings.keys],
        model=manifest.name,
        split=split,
        labels="folder",
        endpoint_url=endpoint,
        client_options=client_options,
        runtime=RUNTIME,
        request_size=settings.batch_size,
        bandwidth=bandwidth,
        dtype=settings.dtype,
        encoding=settings.encoding,
    )
    sampler = EpochSampler(len(settings.keys), settings.seed)
    return Loader(name, _loader(dataset, settings, sampler), sampler)


def flat(features: Any) -> Any:
    """``[B, ...]`` features as ``[B, D]`` float32 rows."""
    return features.reshape(features.shape[0], -1).float()


def held_out_features(
    s3: Any, bucket: str, keys: Sequence[str], manifest: Manifest, blocks: FrozenBlocks
) -> tuple[Any, Any]:
    """Features and labels of the held-out objects, computed here (never timed)."""
    import torch

    transform = DecodeImage(manifest.preprocess)
    images, labels = [], []
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        image, label = transform(_Reader(key, body))
        images.append(image)
        labels.append(label)
    return flat(blocks(torch.stack(images))), torch.tensor(labels)


@dataclass(frozen=True)
class _Reader:
    """What :class:`DecodeImage` reads of an s3torchconnector reader."""

    key: str
    body: bytes

    def read(self) -> bytes:
        return self.body


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (this one by default), from ``/proc``."""
    found: list[int] = []
    todo = [os.getpid() if pid is None else pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found

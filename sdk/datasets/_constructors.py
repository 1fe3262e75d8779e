"""The ``from_prefix`` and ``from_objects`` constructors both dataset classes share.

Each spells out its typed keyword-only options (as s3torchconnector's constructors do);
the options of the dataset class itself travel as a typed :class:`DatasetOptions`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self, TypedDict, Unpack

from hapi.models import RuntimeSettings
from hapi.protocol import DEFAULT_REGISTRY_BUCKET

from ..client._client import AugmentSpec
from ._build import LabelsArg, Options, Prepared, SplitArg, prepare


class DatasetOptions(TypedDict, total=False):
    """Options of the dataset classes themselves, taken by every ``from_*`` constructor.

    ``prefetch`` (requests in flight ahead of the training loop), ``augment`` (a random
    view of each sample in place of the preset's centre crop: an ``AugmentPolicy``, its
    spec or its mapping form), ``views`` (views the gateway's cache keeps per object) and
    ``seed`` (the shuffle's, and the views') apply to both; the others to
    :class:`IterableFeatureDataset` only (see there).
    """

    prefetch: int
    shuffle: bool
    seed: int
    rank: int | None
    world_size: int | None
    progress: bool
    drop_last: bool
    shuffle_buffer: int
    batch_size: int | None
    with_info: bool
    augment: AugmentSpec
    views: int


class Constructors:
    """Classmethod constructors of a dataset class built from a :class:`Prepared`: the class
    defines :meth:`_create`, which takes the options of the class itself."""

    READERS_IN_TURN: ClassVar[int | None] = None
    """Readers the planner assumes wait for each batch before computing on it (the
    map-style form's DataLoader workers); ``None``: requests go ahead of the compute."""

    @classmethod
    def from_prefix(
        cls,
        uri: str,
        *,
        model: str,
        split: SplitArg = "auto",
        freeze: int | None = None,
        labels: LabelsArg = "folder",
        dtype: str = "float32",
        encoding: str = "zeros",
        endpoint_url: str | Sequence[str] | None = None,
        client_options: Mapping[str, Any] | None = None,
        registry_bucket: str = DEFAULT_REGISTRY_BUCKET,
        runtime: RuntimeSettings | None = None,
        request_size: int = 32,
        bandwidth: float | str | None = None,
        local_cache: str | os.PathLike[str] | None = None,
        **dataset: Unpack[DatasetOptions],
    ) -> Self:
        """Every image (``.jpg``, ``.jpeg``, ``.png``, ``.webp``) under an ``s3://`` prefix.

        Args:
            uri: ``s3://bucket/prefix/``.
            model: ``NAME`` or ``NAME@VERSION`` in the registry; the version is pinned.
            split: ``"auto"`` (the planner decides), an integer ``0..freeze``, or
                ``None`` for no pushdown (raw objects, every block here).
            freeze: Features are the output of blocks ``[0, freeze)``; the manifest's
                freeze point when omitted.
            labels: ``"folder"`` (ImageFolder convention), ``"manifest:s3://...csv"`` or
                ``.jsonl``, ``"cls"`` (shards), a function of the key, or ``None``.
            dtype: Wire dtype of the features: ``float32``, ``float16``, ``bfloat16``.
            encoding: ``zeros`` (the default): pushed-down features cross the wire
                without their zero words (about half the bytes after a ReLU; the same
                features here); ``dense``: the plain safetensors answer.
            endpoint_url: The gateway, or several gateways in front of the same store
                (a list, or comma-separated): requests are spread over them and fail
                over from one that is down; else ``AWS_ENDPOINT_URL_S3``,
                ``AWS_ENDPOINT_URL``.
            client_options: More ``boto3.client`` arguments (credentials, region,
                config); they must pickle, since every worker builds its own client.
            registry_bucket: The registry bucket (the gateway's).
            runtime: :class:`hapi.models.RuntimeSettings` for the blocks run here.
            request_size: Objects per request to the gateway.
            bandwidth: For ``split="auto"``: a hint of the bandwidth to start from, in
                bits per second or as text (``"100mbit"``; default: the
                ``HAPI_BANDWIDTH`` variable), used when no figure is remembered for the
                endpoint; the job's own responses then measure the link. ``"probe"``
                measures it before planning instead (about a second of the link).
            local_cache: A directory on this machine that keeps the features (at the
                freeze point) of every object read, so later epochs read them from disk
                and cross no network; keyed by object (and its ETag when listed), model
                blocks, split and dtype. ``None``: no local cache.
            **dataset: Options of the dataset class (:class:`DatasetOptions`:
                ``prefetch``; for the iterable form also ``shuffle``, ``seed``, ``rank``,
                ``world_size``, ``progress``, ``drop_last``, ``shuffle_buffer``,
                ``batch_size``, ``with_info``).

        Raises:
            NoSuchModel: The registry has no such model.
            LabelError: An object has no label.
            RequestError: Listing the prefix failed.
            ValueError: An invalid argument, or no images under the prefix.
        """
        options = Options.of_call(locals())
        return cls._from(uri, options, dataset, shards=False)

    @classmethod
    def from_objects(
        cls,
        uris: Sequence[str],
        *,
        model: str,
        split: SplitArg = "auto",
        freeze: int | None = None,
        labels: LabelsArg = "folder",
        dtype: str = "float32",
        encoding: str = "zeros",
        endpoint_url: str | Sequence[str] | None = None,
        client_options: Mapping[str, Any] | None = None,
        registry_bucket: str = DEFAULT_REGISTRY_BUCKET,
        runtime: RuntimeSettings | None = None,
        request_size: int = 32,
        bandwidth: float | str | None = None,
        local_cache: str | os.PathLike[str] | None = None,
        **dataset: Unpack[DatasetOptions],
    ) -> Self:
        """The images at ``uris`` (``s3://bucket/key``, one bucket), in that order.

        The options are :meth:`from_prefix`'s; manifest labels match full keys.
        """
        if isinstance(uris, str):
            raise TypeError("from_objects takes a list of s3:// URIs; use from_prefix for one")
        options = Options.of_call(locals())
        return cls._from(list(uris), options, dataset, shards=False)

    @classmethod
    def _from(
        cls,
        what: str | Sequence[str],
        options: Options,
        dataset: DatasetOptions,
        *,
        shards: bool,
    ) -> Self:
        prepared = prepare(what, options, shards=shards, readers_in_turn=cls.READERS_IN_TURN)
        return cls._create(prepared, options.request_size, dataset)

    @classmethod
    def _create(cls, prepared: Prepared, request_size: int, dataset: DatasetOptions) -> Self:
        raise NotImplementedError(f"{cls.__name__} defines no _create")

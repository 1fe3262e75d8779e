"""hapi.protocol: what two or more of hapi's packages share, and nothing of hapi below it.

The wire format of pushdown answers (:func:`encode_features`, :func:`decode_features`, and
the ``zeros`` encoding of their bodies, :func:`decode_zeros`),
the control plane's typed schema (:class:`GatewayStats`, :class:`ModelProfile`, ...), where
the registry and the feature cache keep what (:func:`manifest_key`, :func:`cache_key`, ...),
S3's XML (:func:`parse_error`, :func:`parse_list_page`), sizes and bandwidths
(:func:`parse_size`, :func:`parse_bandwidth`), :class:`Credentials`, and the interface of
a store's placement lookup (:class:`Placement`).

Data, formats and pure functions only: no I/O, and no HTTP, S3 or CLI library (an
import-linter contract keeps it so). The placement lookups live in :mod:`hapi.store`, the
command line's shared pieces in :mod:`hapi.models.cli`, and listing the cache with
``hapi cache``.

The gateway, the SDK, the planner, the registry and the CLI all import from here, so a
change to the contract between them is a change in one place.
"""

from __future__ import annotations

from ._augment import (
    AUGMENT_TRANSFORMS,
    MAX_SEED,
    MAX_VIEWS,
    Augmentation,
    AugmentPolicy,
    InvalidAugment,
    ViewParams,
    draw_view,
    view_index,
)
from ._cache import (
    CACHE_PREFIXES,
    DEFAULT_CACHE_BUCKET,
    ENTRY_PREFIX,
    PACK_HEAD,
    CacheEntry,
    ObjectIdentity,
    PackMember,
    cache_key,
    context_digest,
    encode_pack,
    entry_path,
    eviction_order,
    is_cached,
    is_entry,
    is_pack,
    listed_entries,
    pack_index_length,
    pack_path,
    pack_prefix,
    parse_pack_index,
)
from ._credentials import Credentials
from ._errors import CutShort, InvalidValue, ProtocolError
from ._layout import (
    DEFAULT_REGISTRY_BUCKET,
    MODELS_PREFIX,
    block_key,
    latest_key,
    manifest_key,
    model_names,
    model_prefix,
    parse_latest,
    parse_manifest_key,
)
from ._placement import Placement
from ._s3xml import ErrorReply, ListedObject, ListPage, parse_error, parse_list_page
from ._schema import (
    BlockProfile,
    BlockTime,
    Figure,
    GatewayStats,
    MemoryBudgetStats,
    ModelProfile,
    ModelSummary,
    RequestCounters,
    ServedSplit,
    Source,
    StorageLoad,
    StorageProfile,
    TenantStats,
)
from ._units import format_bandwidth, format_bytes, parse_bandwidth, parse_size
from ._wire import CODES as WIRE_CODES
from ._wire import DTYPES as WIRE_DTYPES
from ._wire import ITEMSIZE as WIRE_ITEMSIZE
from ._wire import decode as decode_features
from ._wire import encode as encode_features
from ._wire import header as safetensors_header
from ._wire import to_wire_dtype
from ._zeros import (
    ENCODINGS,
    ZEROS_ENTRY,
    compact_entry,
    decode_zeros,
    end_frame,
    expand_entry,
    raw_frames,
    share_of_zeros,
    word_frames,
    zeros_share,
)

__all__ = [
    "AUGMENT_TRANSFORMS",
    "CACHE_PREFIXES",
    "DEFAULT_CACHE_BUCKET",
    "DEFAULT_REGISTRY_BUCKET",
    "ENCODINGS",
    "ENTRY_PREFIX",
    "MAX_SEED",
    "MAX_VIEWS",
    "MODELS_PREFIX",
    "PACK_HEAD",
    "WIRE_CODES",
    "WIRE_DTYPES",
    "WIRE_ITEMSIZE",
    "ZEROS_ENTRY",
    "AugmentPolicy",
    "Augmentation",
    "BlockProfile",
    "BlockTime",
    "CacheEntry",
    "Credentials",
    "CutShort",
    "ErrorReply",
    "Figure",
    "GatewayStats",
    "InvalidAugment",
    "InvalidValue",
    "ListPage",
    "ListedObject",
    "MemoryBudgetStats",
    "ModelProfile",
    "ModelSummary",
    "ObjectIdentity",
    "PackMember",
    "Placement",
    "ProtocolError",
    "RequestCounters",
    "ServedSplit",
    "Source",
    "StorageLoad",
    "StorageProfile",
    "TenantStats",
    "ViewParams",
    "block_key",
    "cache_key",
    "compact_entry",
    "context_digest",
    "decode_features",
    "decode_zeros",
    "draw_view",
    "encode_features",
    "encode_pack",
    "end_frame",
    "entry_path",
    "eviction_order",
    "expand_entry",
    "format_bandwidth",
    "format_bytes",
    "is_cached",
    "is_entry",
    "is_pack",
    "latest_key",
    "listed_entries",
    "manifest_key",
    "model_names",
    "model_prefix",
    "pack_index_length",
    "pack_path",
    "pack_prefix",
    "parse_bandwidth",
    "parse_error",
    "parse_latest",
    "parse_list_page",
    "parse_manifest_key",
    "parse_pack_index",
    "parse_size",
    "raw_frames",
    "safetensors_header",
    "share_of_zeros",
    "to_wire_dtype",
    "view_index",
    "word_frames",
    "zeros_share",
]

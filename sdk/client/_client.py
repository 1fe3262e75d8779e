"""A real boto3 S3 client that can also ask a hapi gateway for features.

:func:`client` builds an ordinary boto3 client (every S3 operation works, through the
gateway or against any store) whose class gains two methods, the way boto3 itself adds
``upload_file``: ``get_features`` (one object) and ``get_features_batch`` (several).

``get_features`` is a ``GetObject`` underneath. Its hapi parameters ride in the request
context (moved there by a ``provide-client-params`` hook, before botocore validates the
parameters) and become ``x-hapi-*`` headers in a ``before-sign`` hook, so SigV4 covers
them. ``get_features_batch`` is ``POST /{bucket}?hapi-batch``, an operation the S3 model
lacks: the request is built as a botocore ``AWSRequest``, signed by the client's own
request signer with the body's SHA-256 as payload hash, and sent over the client's
connection pool. Both are wire-contract calls of DESIGN.md, "Wire contract for pushdown".

Given several endpoints (``_endpoints`` chooses among them and keeps their health), both
methods run under :func:`failover`, which picks the endpoint of each attempt; for
``get_features`` the choice is pinned in the request context. A ``before-sign`` hook
moves every request onto its endpoint before SigV4 signs the host (plain S3 calls: the
first healthy endpoint; their botocore retries re-sign, so they move on too). A
``needs-retry`` hook, asked before botocore's retry policy, declines botocore's own
retries of feature requests (the failover loop retries them elsewhere) and marks an
endpoint down when a plain call cannot reach it.

Given a placement too (``_placement``: which storage node holds each object), a feature
request goes to the gateway beside its object while that gateway is healthy, and a batch is
cut into one part per gateway, sent at once, whose answers are put back in key order.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import boto3
import urllib3
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    IncompleteReadError,
)

from hapi.protocol import (
    ENCODINGS,
    AugmentPolicy,
    CutShort,
    InvalidValue,
    Placement,
    decode_zeros,
    parse_error,
)
from hapi.protocol import WIRE_DTYPES as DTYPES
from hapi.protocol import decode_features as decode

from ._endpoints import EndpointFailure, EndpointPool, failover, rebase, resolve_endpoints
from ._errors import (
    REFUSED_STATUSES,
    PushdownUnavailable,
    RequestError,
    SDKError,
    request_error,
)
from ._features import Features
from ._parts import merge
from ._placement import Locality, resolve_placement
from ._wire import WireSpan, read_timed

AugmentSpec = AugmentPolicy | str | Mapping[str, Any] | None
"""An augmentation policy, its spec string or its mapping form; ``None``: none."""
_CONTEXT_KEY = "hapi_features"  # the x-hapi-* headers of a GetObject
_PINNED_KEY = "hapi_pinned"  # the endpoint the failover loop chose for this attempt
_SENT_KEY = "hapi_endpoint"  # where the request went, for the needs-retry hook
_PARAMS_KEY = "HapiFeatures"  # popped from GetObject's parameters before validation
_POOL_ATTRIBUTE = "_hapi_endpoints"
_LOCALITY_ATTRIBUTE = "_hapi_locality"
_GATEWAY_MARK = "x-hapi-request-id"  # the gateway stamps every response with it
_RETRYABLE = {"SlowDown", "ServiceUnavailable", "RequestTimeout", "InternalError"}
# Refused, reset, timed out or cut short: the endpoint, not the request, is at fault.
# urllib3's ProtocolError: a chunked body (an encoded answer that streamed) whose peer
# went away, which botocore's body reader passes through as it is.
_TRANSPORT_ERRORS = (
    ConnectionError,
    HTTPClientError,
    IncompleteReadError,
    urllib3.exceptions.ProtocolError,
)


def client(
    endpoint_url: str | Sequence[str] | None = None,
    *,
    placement: str | Placement | None = None,
    **boto3_kwargs: Any,
) -> Any:
    """A boto3 S3 client with ``get_features`` and ``get_features_batch``.

    Path-style addressing is the default (gateways and local stores seldom have wildcard
    DNS); a ``config=`` passed in is merged over it.

    Several gateways in front of one store can be given as one client's endpoints: feature
    requests are spread over them (to the one with the fewest outstanding, in turn among
    equals) and a request that meets a dead or overloaded gateway is retried on another;
    plain S3 calls go to the first healthy one. ``meta.endpoint_url`` is the first.

    Args:
        endpoint_url: The gateway (or any S3 store), or several gateways as a list or
            comma-separated; else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``
            (either may list several), else AWS.
        placement: Which storage node holds each object, so that each feature request
            (each part of a batch) goes to the gateway on that node, the endpoint whose
            host is the node's: a spec such as ``seaweedfs:filer=URL,master=URL``, or a
            placement object; else ``HAPI_PLACEMENT``; else none (requests spread over
            the endpoints). Used only with several endpoints.
        **boto3_kwargs: Anything ``boto3.client("s3", ...)`` accepts (``region_name``,
            ``aws_access_key_id``, ``config``...).

    Returns:
        The client; see :func:`get_features` and :func:`get_features_batch` for the
        added methods.

    Raises:
        ValueError: An endpoint is not an ``http(s)://`` URL, or the placement spec is
            not understood.
    """
    endpoints = resolve_endpoints(endpoint_url, os.environ)
    lookup = resolve_placement(placement, os.environ)
    config = Config(s3={"addressing_style": "path"})
    given = boto3_kwargs.pop("config", None)
    if given is not None:
        config = config.merge(given)
    session = boto3.session.Session()
    session.events.register("creating-client-class.s3", _add_methods, unique_id="hapi-methods")
    s3 = session.client(
        "s3", endpoint_url=endpoints[0] if endpoints else None, config=config, **boto3_kwargs
    )
    pool = EndpointPool(endpoints or (s3.meta.endpoint_url,))
    setattr(s3, _POOL_ATTRIBUTE, pool)
    locality = Locality(lookup, pool.endpoints) if lookup and len(pool) > 1 else None
    setattr(s3, _LOCALITY_ATTRIBUTE, locality)
    events = s3.meta.events
    # unique_id is per emitter, and the client's emitter is a copy of the session's.
    events.register("provide-client-params.s3.GetObject", _take_params, unique_id="hapi-params")
    events.register("before-sign.s3.GetObject", _add_headers, unique_id="hapi-headers")
    events.register("before-sign.s3", functools.partial(_route, pool), unique_id="hapi-route")
    events.register_first(
        "needs-retry.s3", functools.partial(_observe, pool), unique_id="hapi-failover"
    )
    return s3


def _pool(s3: Any) -> EndpointPool:
    pool: EndpointPool = getattr(s3, _POOL_ATTRIBUTE)
    return pool


def _beside(s3: Any, bucket: str, key: str) -> str | None:
    """The endpoint beside the object's bytes, when the client knows the placement."""
    locality: Locality | None = getattr(s3, _LOCALITY_ATTRIBUTE, None)
    return None if locality is None else locality.endpoint_for(bucket, key)


def _add_methods(class_attributes: dict[str, Any], **_: Any) -> None:
    class_attributes["get_features"] = get_features
    class_attributes["get_features_batch"] = get_features_batch


def _take_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    if _PARAMS_KEY in params:
        hapi = params.pop(_PARAMS_KEY)
        context[_CONTEXT_KEY] = hapi["headers"]
        context[_PINNED_KEY] = hapi["endpoint"]


def _add_headers(request: AWSRequest, **_: Any) -> None:
    hapi = request.context.get(_CONTEXT_KEY)
    if hapi:
        for name, value in hapi.items():
            request.headers[f"x-hapi-{name}"] = str(value)


def _route(pool: EndpointPool, request: AWSRequest, **_: Any) -> None:
    """Before signing (so SigV4 covers the host): move the request onto its endpoint, the
    one the failover loop pinned, else the first healthy one. A botocore retry re-signs,
    so a plain call's retry goes to the next healthy endpoint."""
    if len(pool) == 1:
        return
    target = request.context.get(_PINNED_KEY) or pool.primary()
    request.context[_SENT_KEY] = target
    request.url = rebase(request.url, pool.endpoints, target)


def _observe(
    pool: EndpointPool,
    request_dict: dict[str, Any],
    response: tuple[AWSResponse, dict[str, Any]] | None,
    caught_exception: Exception | None,
    attempts: int,
    **_: Any,
) -> float | bool | None:
    """botocore's ``needs-retry``, asked first: ``False`` declines a retry, a number retries
    after that many seconds, ``None`` leaves the decision to botocore's retry policy."""
    context = request_dict.get("context") or {}
    if _CONTEXT_KEY in context:
        return False  # a features request: failover() retries it, elsewhere
    endpoint = context.get(_SENT_KEY)
    if endpoint is None:
        return None
    status = response[0].status_code if response is not None else 0
    if isinstance(caught_exception, _TRANSPORT_ERRORS):
        pool.mark_down(endpoint, str(caught_exception))
    elif status in (502, 503, 504):
        pool.mark_down(endpoint, f"HTTP {status}")
    else:
        if response is not None:
            pool.mark_up(endpoint)
        return None
    return 0 if attempts < len(pool) and pool.any_up() else None


def _encoding_field(encoding: str) -> dict[str, str]:
    """The request's ``encoding`` field: none for ``dense``, the wire's default, so that a
    dense request reads as it always has."""
    return {} if encoding == "dense" else {"encoding": encoding}


def _augment_fields(
    augment: AugmentSpec, seed: int, epoch: int, views: int
) -> dict[str, str | int]:
    """The augmentation's request fields (none without a policy).

    Raises:
        ValueError: A policy that does not parse, or an option out of range.
    """
    if augment is None:
        return {}
    policy = augment if isinstance(augment, AugmentPolicy) else policy_of(augment)
    for name, value in (("seed", seed), ("epoch", epoch), ("views", views)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, not {value!r}")
    return {"augment": policy.spec(), "seed": seed, "epoch": epoch, "views": views}


def policy_of(augment: str | Mapping[str, Any]) -> AugmentPolicy:
    """An augmentation policy from its spec string or its mapping form.

    Raises:
        ValueError: It does not parse, or a value is out of range (naming the field).
    """
    if isinstance(augment, str):
        return AugmentPolicy.parse(augment)
    return AugmentPolicy.from_dict(dict(augment))


def _check(model: str, split: int, dtype: str, encoding: str) -> None:
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, not {encoding!r}")
    if not model:
        raise ValueError("model must name a registered model (NAME or NAME@VERSION)")
    if isinstance(split, bool) or not isinstance(split, int) or split < 0:
        raise ValueError(f"split must be an integer >= 0, not {split!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")


def get_features(
    self: Any,
    Bucket: str,
    Key: str,
    model: str,
    split: int,
    dtype: str = "float32",
    *,
    augment: AugmentSpec = None,
    seed: int = 0,
    epoch: int = 0,
    views: int = 0,
    encoding: str = "zeros",
) -> Features:
    """Features of one object (an image, or every sample of a WebDataset shard).

    With several endpoints, the request goes to one of them and is retried on another
    if that one cannot be reached, resets, or answers 503.

    Args:
        Bucket: The bucket.
        Key: The object.
        model: ``NAME`` or ``NAME@VERSION``.
        split: The gateway runs blocks ``[0, split)``; 0 only decodes and preprocesses.
        dtype: ``float32``, ``float16`` or ``bfloat16`` on the wire.
        augment: A random view in place of the preset's centre crop: an
            :class:`AugmentPolicy`, its spec (``"crop(scale=0.08:1);flip(p=0.5)"``) or its
            mapping form (``{"crop": {"scale": [0.08, 1]}, "flip": 0.5}``); see
            docs/protocol.md. ``Features.views`` reports what was drawn.
        seed: The augmentation's seed.
        epoch: The epoch: with ``views=0`` a fresh view each epoch.
        views: Views the gateway's cache keeps per object; epoch ``e`` reads view
            ``e % views`` (0: never cached).
        encoding: ``zeros`` (the default) asks for the body without its zero words
            (about half the bytes after a ReLU; decoded here to the same features), or
            ``dense``: the safetensors body as it is.

    Raises:
        PushdownUnavailable: The endpoint answered with the plain object.
        EndpointsUnavailable: No endpoint could be reached; names each and its failure.
        RequestError: The gateway refused (a subclass per S3 error code), naming the key.
    """
    _check(model, split, dtype, encoding)
    headers = {"model": model, "split": split, "dtype": dtype, **_encoding_field(encoding)}
    headers.update(_augment_fields(augment, seed, epoch, views))

    def attempt(endpoint: str) -> Features:
        hapi = {"headers": headers, "endpoint": endpoint}
        try:
            response = self.get_object(Bucket=Bucket, Key=Key, **{_PARAMS_KEY: hapi})
            answered = response["ResponseMetadata"]["HTTPHeaders"]
            with response["Body"] as body:
                if "x-hapi-split" not in answered:
                    raise PushdownUnavailable(endpoint, f"GET {Key} returned the object")
                content = body.read()
            dense = _safetensors(answered, content, Bucket, Key)
            return _features(dense, answered, Bucket, Key, endpoint, nbytes=len(content))
        except ClientError as exc:
            raise _client_failure(exc, Bucket, Key) from exc
        except _TRANSPORT_ERRORS as exc:
            raise EndpointFailure(str(exc)) from exc
        except BotoCoreError as exc:
            raise RequestError("NetworkError", str(exc), bucket=Bucket, key=Key) from exc

    prefer = _beside(self, Bucket, Key)
    return failover(_pool(self), attempt, bucket=Bucket, key=Key, prefer=prefer)


def get_features_batch(
    self: Any,
    Bucket: str,
    Keys: list[str] | tuple[str, ...],
    model: str,
    split: int,
    dtype: str = "float32",
    *,
    augment: AugmentSpec = None,
    seed: int = 0,
    epoch: int = 0,
    views: int = 0,
    encoding: str = "zeros",
) -> Features:
    """Features of several objects in one request, stacked in key order.

    Objects that fail are left out of the rows and reported in ``errors`` (see
    :meth:`Features.raise_for_errors`). ``SlowDown`` answers are retried after their
    ``Retry-After``. With several endpoints, the request goes to the one with the fewest
    requests outstanding and is retried on another if that one cannot be reached, resets
    or answers 503 (the request is idempotent). With a placement, the keys go in one part
    per gateway beside them, sent at once; the rows come back in key order.

    Args:
        Bucket: The bucket.
        Keys: The objects (images or shards), at least one.
        model: ``NAME`` or ``NAME@VERSION``.
        split: The gateway runs blocks ``[0, split)``.
        dtype: ``float32``, ``float16`` or ``bfloat16`` on the wire.
        augment: A random view of each sample, as for :func:`get_features`.
        seed: The augmentation's seed.
        epoch: The epoch.
        views: Views the gateway's cache keeps per object.
        encoding: ``zeros`` or ``dense``, as for :func:`get_features`.

    Raises:
        PushdownUnavailable: The endpoint is not a hapi gateway: a reply without the
            gateway's mark that is neither a refusal nor a server error.
        EndpointsUnavailable: No endpoint could be reached; names each and its failure.
        AccessDenied: The credentials or permissions were refused (401, 403), by the
            gateway or by whatever answered for it.
        RequestError: The whole request was refused (a subclass per S3 error code), or
            a server error outlasted the retries.
    """
    _check(model, split, dtype, encoding)
    if not Keys:
        raise ValueError("get_features_batch needs at least one key")
    fields: dict[str, Any] = {"model": model, "split": split, "dtype": dtype}
    fields.update(_encoding_field(encoding))
    fields.update(_augment_fields(augment, seed, epoch, views))
    locality: Locality | None = getattr(self, _LOCALITY_ATTRIBUTE, None)
    if locality is None:
        return _batch(self, Bucket, list(Keys), fields, None)
    parts = locality.group(Bucket, Keys)
    if len(parts) == 1:
        return _batch(self, Bucket, list(Keys), fields, parts[0][0])
    with ThreadPoolExecutor(len(parts), thread_name_prefix="hapi-part") as sending:
        answers = [
            sending.submit(_batch, self, Bucket, part, fields, prefer) for prefer, part in parts
        ]
        replies = [answer.result() for answer in answers]
    return merge(list(Keys), [part for _, part in parts], replies)


def _batch(
    s3: Any, bucket: str, keys: list[str], fields: Mapping[str, Any], prefer: str | None
) -> Features:
    """One ``POST ?hapi-batch``, to ``prefer`` while it is healthy."""
    body = json.dumps({"keys": keys, **fields})
    first = keys[0] if len(keys) == 1 else ""
    endpoint, response = _post_batch(s3, bucket, body.encode(), first, prefer)
    if response.status_code != 200 or _GATEWAY_MARK not in response.headers:
        raise _batch_error(response, endpoint, bucket, first)
    return _features(
        response.body,
        response.headers,
        bucket,
        first,
        endpoint,
        nbytes=len(response.content),
        wire=(response.wire,),
    )


@dataclass(frozen=True)
class _Reply:
    """A batch request's answer, its body read and timed (:func:`read_timed`)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes  # as it crossed the wire
    wire: WireSpan
    body: bytes = b""  # a 200's safetensors body (``content`` decoded, when encoded)

    @classmethod
    def read(cls, response: AWSResponse) -> _Reply:
        """``response`` (sent with ``stream_output``), its body read now.

        Raises:
            HTTPClientError: The connection failed while the body was read.
        """
        try:
            content, wire = read_timed(response.raw)
        except urllib3.exceptions.HTTPError as exc:  # what botocore's send wraps so
            raise HTTPClientError(error=exc) from exc
        return cls(response.status_code, response.headers, content, wire)


def _post_batch(
    s3: Any, bucket: str, body: bytes, key: str, prefer: str | None = None
) -> tuple[str, _Reply]:
    def attempt(endpoint: str) -> tuple[str, _Reply]:
        url = f"{endpoint}/{quote(bucket, safe='')}?hapi-batch"
        request = AWSRequest(
            method="POST",
            url=url,
            data=body,
            headers={"Content-Type": "application/json"},
            stream_output=True,  # the body is read here, timed
        )
        request.context[_PINNED_KEY] = endpoint  # so the routing hook leaves it there
        # The client's own signer: its credentials (refreshed as boto3 does), region and
        # signature version. With no Content-MD5 header S3SigV4Auth hashes the body.
        s3._request_signer.sign("GetFeaturesBatch", request)
        try:
            response = _Reply.read(s3._endpoint.http_session.send(request.prepare()))
        except _TRANSPORT_ERRORS as exc:
            raise EndpointFailure(str(exc)) from exc
        except BotoCoreError as exc:
            raise RequestError("NetworkError", str(exc), bucket=bucket, key=key) from exc
        _check_length(response)
        if response.status_code == 200:
            dense = _safetensors(response.headers, response.content, bucket, key)
            response = replace(response, body=dense)
        marked = _GATEWAY_MARK in response.headers
        code = _error_code(response) if marked and response.status_code >= 500 else ""
        if _retryable(response.status_code, code, marked):
            raise EndpointFailure(
                f"HTTP {response.status_code} {code}".rstrip(),
                retry_after=_retry_after(response.headers),
                error=_batch_error(response, endpoint, bucket, key),
            )
        return endpoint, response

    return failover(_pool(s3), attempt, bucket=bucket, key=key, prefer=prefer)


def _check_length(response: _Reply) -> None:
    # botocore sends with enforce_content_length=False: a gateway that dies mid-body
    # leaves a short body here, not an exception.
    expected = response.headers.get("content-length", "")
    if expected.isdigit() and int(expected) != len(response.content):
        raise EndpointFailure(
            f"the response was cut short ({len(response.content)} of {expected} bytes)"
        )


def _safetensors(headers: Mapping[str, str], content: bytes, bucket: str, key: str) -> bytes:
    """An answer's safetensors body: ``content`` as it came, or decoded from the ``zeros``
    encoding. An encoded answer that streamed has no length to check; its end frame says
    whether it is whole.

    Raises:
        EndpointFailure: An encoded answer cut short (retried on another endpoint, as a
            short dense body is).
        RequestError: ``InvalidResponse``: an unknown encoding, or frames that do not decode.
    """
    encoding = headers.get("x-hapi-encoding", "dense")
    if encoding == "dense":
        return content
    try:
        if encoding != "zeros":
            raise InvalidValue(f"an answer in an unknown encoding, {encoding!r}")
        return decode_zeros(content)
    except CutShort as exc:
        raise EndpointFailure(f"the response was cut short: {exc}") from exc
    except InvalidValue as exc:
        raise _unreadable(exc, bucket, key) from exc


def _unreadable(exc: Exception, bucket: str, key: str) -> RequestError:
    return RequestError(
        "InvalidResponse", f"the gateway sent unreadable features: {exc}", bucket=bucket, key=key
    )


def _retryable(status: int, code: str, from_gateway: bool) -> bool:
    """A 5xx from something else than a gateway (a proxy, a load balancer), or one the
    gateway marks as transient."""
    return status >= 500 and (not from_gateway or code in _RETRYABLE)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def _error_code(response: _Reply) -> str:
    return parse_error(response.content).code


def _batch_error(response: _Reply, endpoint: str, bucket: str, key: str) -> SDKError:
    """A batch request's reply other than features. Only an answer without the gateway's
    mark that is neither a refusal nor a server error shows a plain store: a refusal or a
    5xx from whatever answered (a proxy, a store, a gateway's load balancer) says nothing
    about pushdown, so it is an error like the gateway's own."""
    status = response.status_code
    if _GATEWAY_MARK in response.headers or status in REFUSED_STATUSES or status >= 500:
        return _xml_error(response, bucket, key)
    return PushdownUnavailable(endpoint, f"POST ?hapi-batch answered HTTP {status}")


def _client_failure(exc: ClientError, bucket: str, key: str) -> SDKError | EndpointFailure:
    error = _client_error(exc, bucket, key)
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    if _retryable(error.status, error.code, _GATEWAY_MARK in headers):
        reason = f"HTTP {error.status} {error.code}"
        return EndpointFailure(reason, retry_after=_retry_after(headers), error=error)
    return error


def _xml_error(response: _Reply, bucket: str, key: str) -> RequestError:
    error = parse_error(response.content)
    return request_error(
        error.code or f"HTTP{response.status_code}",
        error.message,
        bucket=bucket,
        key=key,
        status=response.status_code,
        request_id=response.headers.get(_GATEWAY_MARK, ""),
    )


def _client_error(exc: ClientError, bucket: str, key: str) -> RequestError:
    error = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    return request_error(
        str(error.get("Code", "Unknown")),
        str(error.get("Message", "")),
        bucket=bucket,
        key=key,
        status=int(meta.get("HTTPStatusCode", 0)),
        request_id=str(meta.get("HTTPHeaders", {}).get(_GATEWAY_MARK, meta.get("RequestId", ""))),
    )


def _features(
    body: bytes,
    headers: Mapping[str, str],
    bucket: str,
    key: str,
    endpoint: str,
    *,
    nbytes: int,
    wire: tuple[WireSpan, ...] = (),
) -> Features:
    """The features of a safetensors ``body`` (``nbytes``: what crossed the wire)."""
    try:
        tensors, meta = decode(body)
        keys = tuple(json.loads(meta.get("keys", "[]")))
        errors = json.loads(meta.get("errors", "{}"))
        views = tuple(json.loads(meta["views"])) if "views" in meta else None
        features = tensors["features"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _unreadable(exc, bucket, key) from exc
    return Features(
        features=features,
        labels=tensors.get("labels"),
        keys=keys,
        errors={k: _per_key_error(v, bucket, k) for k, v in errors.items()},
        model=headers.get("x-hapi-model", ""),
        split=int(headers.get("x-hapi-split", meta.get("split", "0"))),
        dtype=headers.get("x-hapi-dtype", "float32"),
        nbytes=nbytes,
        server_timing=_server_timing(headers.get("server-timing", "")),
        endpoint=endpoint,
        cache=headers.get("x-hapi-cache", ""),
        views=views,
        wire=wire,
    )


def _per_key_error(text: str, bucket: str, key: str) -> RequestError:
    code, _, message = str(text).partition(": ")
    return request_error(code or "Unknown", message, bucket=bucket, key=key)


def _server_timing(value: str) -> dict[str, float]:
    timings: dict[str, float] = {}
    for entry in value.split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            label, _, number = param.strip().partition("=")
            if label == "dur" and name:
                try:
                    timings[name] = float(number)
                except ValueError:
                    continue
    return timings

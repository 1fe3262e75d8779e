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
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

import boto3
import numpy as np
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from hapi.models._wire import DTYPES, decode

from ._errors import PushdownUnavailable, RequestError, request_error

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_CONTEXT_KEY = "hapi_features"
_PARAMS_KEY = "HapiFeatures"  # popped from GetObject's parameters before validation
_GATEWAY_MARK = "x-hapi-request-id"  # the gateway stamps every response with it
_ATTEMPTS = 5
_MAX_BACKOFF_S = 5.0
_RETRYABLE = {"SlowDown", "ServiceUnavailable", "RequestTimeout", "InternalError"}


def resolve_endpoint(endpoint_url: str | None, environ: Mapping[str, str]) -> str | None:
    """The endpoint as boto3 resolves it: the argument, then ``AWS_ENDPOINT_URL_S3``,
    then ``AWS_ENDPOINT_URL``; ``None`` means AWS's own endpoints."""
    if endpoint_url:
        return endpoint_url
    return next((environ[name] for name in ENDPOINT_VARIABLES if environ.get(name)), None)


def client(endpoint_url: str | None = None, **boto3_kwargs: Any) -> Any:
    """A boto3 S3 client with ``get_features`` and ``get_features_batch``.

    Path-style addressing is the default (gateways and local stores seldom have wildcard
    DNS); a ``config=`` passed in is merged over it.

    Args:
        endpoint_url: The gateway (or any S3 store); else ``AWS_ENDPOINT_URL_S3``, else
            ``AWS_ENDPOINT_URL``, else AWS.
        **boto3_kwargs: Anything ``boto3.client("s3", ...)`` accepts (``region_name``,
            ``aws_access_key_id``, ``config``...).

    Returns:
        The client; see :func:`get_features` and :func:`get_features_batch` for the
        added methods.
    """
    config = Config(s3={"addressing_style": "path"})
    given = boto3_kwargs.pop("config", None)
    if given is not None:
        config = config.merge(given)
    session = boto3.session.Session()
    session.events.register("creating-client-class.s3", _add_methods, unique_id="hapi-methods")
    s3 = session.client(
        "s3", endpoint_url=resolve_endpoint(endpoint_url, os.environ), config=config, **boto3_kwargs
    )
    events = s3.meta.events
    # unique_id is per emitter, and the client's emitter is a copy of the session's.
    events.register("provide-client-params.s3.GetObject", _take_params, unique_id="hapi-params")
    events.register("before-sign.s3.GetObject", _add_headers, unique_id="hapi-headers")
    return s3


def _add_methods(class_attributes: dict[str, Any], **_: Any) -> None:
    class_attributes["get_features"] = get_features
    class_attributes["get_features_batch"] = get_features_batch


def _take_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    if _PARAMS_KEY in params:
        context[_CONTEXT_KEY] = params.pop(_PARAMS_KEY)


def _add_headers(request: AWSRequest, **_: Any) -> None:
    hapi = request.context.get(_CONTEXT_KEY)
    if hapi:
        for name, value in hapi.items():
            request.headers[f"x-hapi-{name}"] = str(value)


@dataclass(frozen=True)
class Features:
    """What a gateway sent back for one object or a batch of objects.

    Args:
        features: ``float32`` array ``[N, ...]``: the output of blocks ``[0, split)`` for
            every sample (a shard contributes one row per sample), read-only.
        labels: ``int64`` array ``[N]`` (``-1`` where a sample has none), or ``None``.
        keys: The sample keys in row order: the object key, or ``key#member`` for a
            sample of a shard.
        errors: Per-object failures of a batch, by key.
        model: ``NAME@VERSION`` the gateway used.
        split: The split the gateway ran.
        dtype: The wire dtype (features are widened to float32 on arrival).
        nbytes: Bytes of the response body.
        server_timing: The gateway's ``Server-Timing`` entries, in milliseconds.
    """

    features: np.ndarray
    labels: np.ndarray | None
    keys: tuple[str, ...]
    errors: Mapping[str, RequestError] = field(default_factory=dict)
    model: str = ""
    split: int = 0
    dtype: str = "float32"
    nbytes: int = 0
    server_timing: Mapping[str, float] = field(default_factory=dict)

    def raise_for_errors(self) -> None:
        """Raise the first per-object error of a batch, if any."""
        for error in self.errors.values():
            raise error


def _check(model: str, split: int, dtype: str) -> None:
    if not model:
        raise ValueError("model must name a registered model (NAME or NAME@VERSION)")
    if isinstance(split, bool) or not isinstance(split, int) or split < 0:
        raise ValueError(f"split must be an integer >= 0, not {split!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")


def get_features(
    self: Any, Bucket: str, Key: str, model: str, split: int, dtype: str = "float32"
) -> Features:
    """Features of one object (an image, or every sample of a WebDataset shard).

    Args:
        Bucket: The bucket.
        Key: The object.
        model: ``NAME`` or ``NAME@VERSION``.
        split: The gateway runs blocks ``[0, split)``; 0 only decodes and preprocesses.
        dtype: ``float32``, ``float16`` or ``bfloat16`` on the wire.

    Raises:
        PushdownUnavailable: The endpoint answered with the plain object.
        RequestError: The gateway refused (a subclass per S3 error code), naming the key.
    """
    _check(model, split, dtype)
    hapi = {"model": model, "split": split, "dtype": dtype}
    try:
        response = self.get_object(Bucket=Bucket, Key=Key, **{_PARAMS_KEY: hapi})
    except ClientError as exc:
        raise _client_error(exc, Bucket, Key) from exc
    except BotoCoreError as exc:
        raise RequestError("NetworkError", str(exc), bucket=Bucket, key=Key) from exc
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    with response["Body"] as body:
        if "x-hapi-split" not in headers:
            raise PushdownUnavailable(self.meta.endpoint_url, f"GET {Key} returned the object")
        return _features(body.read(), headers, Bucket, Key)


def get_features_batch(
    self: Any,
    Bucket: str,
    Keys: list[str] | tuple[str, ...],
    model: str,
    split: int,
    dtype: str = "float32",
) -> Features:
    """Features of several objects in one request, stacked in key order.

    Objects that fail are left out of the rows and reported in ``errors`` (see
    :meth:`Features.raise_for_errors`). ``SlowDown`` answers are retried after their
    ``Retry-After``.

    Args:
        Bucket: The bucket.
        Keys: The objects (images or shards), at least one.
        model: ``NAME`` or ``NAME@VERSION``.
        split: The gateway runs blocks ``[0, split)``.
        dtype: ``float32``, ``float16`` or ``bfloat16`` on the wire.

    Raises:
        PushdownUnavailable: The endpoint is not a hapi gateway.
        RequestError: The whole request was refused (a subclass per S3 error code).
    """
    _check(model, split, dtype)
    if not Keys:
        raise ValueError("get_features_batch needs at least one key")
    body = json.dumps({"keys": list(Keys), "model": model, "split": split, "dtype": dtype})
    first = Keys[0] if len(Keys) == 1 else ""
    response = _post_batch(self, Bucket, body.encode(), first)
    if response.status_code != 200:
        if _GATEWAY_MARK not in response.headers:
            raise PushdownUnavailable(
                self.meta.endpoint_url, f"POST ?hapi-batch answered HTTP {response.status_code}"
            )
        raise _xml_error(response, Bucket, first)
    return _features(response.content, response.headers, Bucket, first)


def _post_batch(s3: Any, bucket: str, body: bytes, key: str) -> AWSResponse:
    base = (s3.meta.endpoint_url or "").rstrip("/")
    url = f"{base}/{quote(bucket, safe='')}?hapi-batch"
    for attempt in range(_ATTEMPTS):
        request = AWSRequest(
            method="POST", url=url, data=body, headers={"Content-Type": "application/json"}
        )
        # The client's own signer: its credentials (refreshed as boto3 does), region and
        # signature version. With no Content-MD5 header S3SigV4Auth hashes the body.
        s3._request_signer.sign("GetFeaturesBatch", request)
        try:
            response: AWSResponse = s3._endpoint.http_session.send(request.prepare())
        except BotoCoreError as exc:
            if attempt + 1 == _ATTEMPTS:
                raise RequestError("NetworkError", str(exc), bucket=bucket, key=key) from exc
            time.sleep(_backoff(attempt, None))
            continue
        if response.status_code < 500 or attempt + 1 == _ATTEMPTS:
            return response
        if _GATEWAY_MARK in response.headers and _error_code(response) not in _RETRYABLE:
            return response
        time.sleep(_backoff(attempt, response.headers.get("retry-after")))
    raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


def _backoff(attempt: int, retry_after: str | None) -> float:
    if retry_after is not None and retry_after.strip().isdigit():
        return min(float(retry_after), _MAX_BACKOFF_S)
    return float(min(_MAX_BACKOFF_S, 0.1 * 2**attempt * (1 + random.random())))


def _error_code(response: AWSResponse) -> str:
    try:
        return ElementTree.fromstring(response.content).findtext("Code") or ""
    except ElementTree.ParseError:
        return ""


def _xml_error(response: AWSResponse, bucket: str, key: str) -> RequestError:
    try:
        root = ElementTree.fromstring(response.content)
        code = root.findtext("Code") or f"HTTP{response.status_code}"
        message = root.findtext("Message") or ""
    except ElementTree.ParseError:
        code, message = f"HTTP{response.status_code}", response.content[:200].decode("replace")
    return request_error(
        code,
        message,
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


def _features(body: bytes, headers: Mapping[str, str], bucket: str, key: str) -> Features:
    try:
        tensors, meta = decode(body)
        keys = tuple(json.loads(meta.get("keys", "[]")))
        errors = json.loads(meta.get("errors", "{}"))
        features = tensors["features"]
    except (ValueError, KeyError, TypeError) as exc:
        raise RequestError(
            "InvalidResponse",
            f"the gateway sent unreadable features: {exc}",
            bucket=bucket,
            key=key,
        ) from exc
    return Features(
        features=features,
        labels=tensors.get("labels"),
        keys=keys,
        errors={k: _per_key_error(v, bucket, k) for k, v in errors.items()},
        model=headers.get("x-hapi-model", ""),
        split=int(headers.get("x-hapi-split", meta.get("split", "0"))),
        dtype=headers.get("x-hapi-dtype", "float32"),
        nbytes=len(body),
        server_timing=_server_timing(headers.get("server-timing", "")),
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

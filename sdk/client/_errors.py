"""The error tree of ``hapi.sdk``.

::

    SDKError                                base of everything raised here
    ├── RequestError                        the gateway or the store refused a request;
    │   │                                   .code .status .bucket .key .request_id
    │   ├── NoSuchModel (LookupError)       no such model in the registry (404)
    │   ├── NoSuchKey (LookupError)         the object does not exist (404)
    │   ├── UnprocessableObject (ValueError)
    │   │                                   not a decodable image or shard (422, or
    │   │                                   the same failure when decoding locally)
    │   ├── InvalidArgument (ValueError)    a bad split, dtype or request (400)
    │   ├── AccessDenied                    the credentials or the permissions were
    │   │                                   refused (401, 403): never a reason to fall back
    │   ├── SlowDown                        still saturated after the retries (503)
    │   └── EndpointsUnavailable            no endpoint reachable through every retry;
    │                                       .endpoints: each one's last failure
    ├── PushdownUnavailable                 the endpoint is a plain S3 store: no features
    ├── ModelUnavailable                    the frozen blocks cannot be loaded or run here
    ├── ProbeError                          a gateway's ``/_hapi/`` endpoints failed, or what
    │                                       answered is not a hapi gateway
    ├── LabelError (LookupError)            an object has no label in the label source
    └── StateMismatch (ValueError)          a saved dataset position belongs to another
                                            dataset, listing or pass (the message says how)

Gateway errors arrive as S3 XML (botocore's ``ClientError`` for ``get_features``); they are
translated where they enter, in :func:`request_error`, so training code catches these
classes and every message names the object it concerns.

Every class can also be rebuilt from its text alone, which is how PyTorch's DataLoader
re-raises an error of a worker process in the main one: the type survives there (the
fields other than the text are then empty).

A dataset computes locally only after :class:`PushdownUnavailable` (a plain store) or
:class:`NoSuchModel` (a gateway whose registry lacks the model). Everything else, a
refusal or a server error (``status >= 500``) included, is raised at the batch it concerns.
"""

from __future__ import annotations

from collections.abc import Mapping


class SDKError(Exception):
    """Base class of every error raised by ``hapi.sdk``."""


class RequestError(SDKError):
    """The gateway (or the store behind it) answered a request with an error.

    Args:
        code: The S3 error code (``NoSuchModel``, ``UnprocessableObject``, ...).
        message: The server's explanation.
        bucket: The bucket of the request.
        key: The object the error concerns (``""`` when it concerns no single object).
        status: The HTTP status (0 when the error was found locally).
        request_id: The server's request id, for its logs.

    ``RequestError(text)`` alone rebuilds an error from its text (a DataLoader worker's
    error re-raised in the main process).
    """

    def __init__(
        self,
        code: str,
        message: str | None = None,
        *,
        bucket: str = "",
        key: str = "",
        status: int = 0,
        request_id: str = "",
    ) -> None:
        if message is None:
            super().__init__(code)
            code, message = "", code
        else:
            where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
            super().__init__(f"{code} for {where}: {message}")
        self.code = code
        self.message = message
        self.bucket = bucket
        self.key = key
        self.status = status
        self.request_id = request_id


class NoSuchModel(RequestError, LookupError):
    """The registry (the gateway's, or the one the SDK reads) has no such model."""


class NoSuchKey(RequestError, LookupError):
    """The object does not exist."""


class UnprocessableObject(RequestError, ValueError):
    """The object is not a decodable image or WebDataset shard."""


class InvalidArgument(RequestError, ValueError):
    """The request names an invalid split, dtype or body."""


class AccessDenied(RequestError):
    """The request's credentials or permissions were refused (HTTP 401 or 403).

    By the gateway (``AccessDenied``, ``SignatureDoesNotMatch``, ``InvalidAccessKeyId``)
    or by whatever answered for it. A dataset raises it at the batch it concerns and keeps
    asking the gateway: a refusal never turns pushdown off.
    """


class SlowDown(RequestError):
    """The gateway stayed saturated through every retry."""


class EndpointsUnavailable(RequestError):
    """No endpoint answered: each refused, reset or timed out, through every retry.

    The code is ``NetworkError``, as for a single endpoint that cannot be reached.

    Args:
        endpoints: Each endpoint and its last failure (``"up"`` if it had none).
        attempts: The attempts made.
        bucket: The bucket of the request.
        key: The object the request concerned, if one.
    """

    def __init__(
        self,
        endpoints: Mapping[str, str] | str,
        *,
        attempts: int = 0,
        bucket: str = "",
        key: str = "",
    ) -> None:
        if isinstance(endpoints, str):  # rebuilt from its text
            super().__init__(endpoints)
            self.endpoints: dict[str, str] = {}
            return
        named = "; ".join(f"{endpoint} ({failure})" for endpoint, failure in endpoints.items())
        super().__init__(
            "NetworkError",
            f"no endpoint answered in {attempts} attempts: {named}",
            bucket=bucket,
            key=key,
        )
        self.endpoints = dict(endpoints)


class PushdownUnavailable(SDKError):
    """The endpoint serves plain objects only: it is not a hapi gateway.

    Args:
        endpoint: The endpoint URL.
        reason: What showed it.
    """

    def __init__(self, endpoint: str, reason: str | None = None) -> None:
        if reason is None:  # rebuilt from its text
            super().__init__(endpoint)
            self.endpoint = ""
            return
        super().__init__(f"{endpoint} does not serve hapi pushdown: {reason}")
        self.endpoint = endpoint


class ModelUnavailable(SDKError):
    """The model's blocks cannot be loaded from the registry or run by onnxruntime here."""


class LabelError(SDKError, LookupError):
    """An object has no label in the dataset's label source."""


class StateMismatch(SDKError, ValueError):
    """A saved dataset position cannot continue here: it belongs to another dataset (other
    objects, seed, model or split policy), to a listing that has changed since, or is
    incomplete for the layout asked for; the message says which."""


_BY_CODE: Mapping[str, type[RequestError]] = {
    "NoSuchModel": NoSuchModel,
    "NoSuchKey": NoSuchKey,
    "UnprocessableObject": UnprocessableObject,
    "InvalidArgument": InvalidArgument,
    "SlowDown": SlowDown,
    "AccessDenied": AccessDenied,
    "SignatureDoesNotMatch": AccessDenied,
    "InvalidAccessKeyId": AccessDenied,
}
REFUSED_STATUSES = (401, 403)
"""Statuses of a refusal: the credentials or the permissions, never a sign of a plain store."""


def request_error(
    code: str,
    message: str,
    *,
    bucket: str,
    key: str = "",
    status: int = 0,
    request_id: str = "",
) -> RequestError:
    """The :class:`RequestError` subclass for an S3 error code, else for the status (any
    401 or 403 is :class:`AccessDenied`), else the base."""
    cls = _BY_CODE.get(code) or (AccessDenied if status in REFUSED_STATUSES else RequestError)
    return cls(code, message, bucket=bucket, key=key, status=status, request_id=request_id)


class ProbeError(SDKError):
    """A request to a gateway's ``/_hapi/`` endpoints failed or returned nonsense (httpx
    errors are wrapped where they enter, in the probe)."""

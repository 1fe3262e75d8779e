"""The gateway's error tree; every exception here becomes S3 XML in exactly one handler.

::

    S3Error                              code, status, message, resource
    ├── AccessDenied                     403
    ├── InvalidAccessKeyId               403
    ├── SignatureDoesNotMatch            403
    ├── RequestTimeTooSkewed             403
    ├── AuthorizationHeaderMalformed     400
    ├── AuthorizationQueryParametersError 400
    ├── XAmzContentSHA256Mismatch        400
    ├── BadDigest                        400  (Content-MD5 or checksum header/trailer mismatch)
    ├── InvalidDigest                    400  (Content-MD5 is not base64)
    ├── IncompleteBody                   400
    ├── InvalidRequest                   400
    ├── InvalidArgument                  400
    ├── InvalidBucketName                400  (not a valid S3 bucket name once decoded)
    ├── MalformedPOSTRequest             400  (form uploads: body not multipart/form-data)
    ├── InvalidPolicyDocument            400  (form uploads: policy not readable)
    ├── MissingFields                    400  (form uploads: V2 signature fields incomplete)
    ├── MaxPostPreDataLengthExceeded     400  (form uploads: fields before the file too large)
    ├── EntityTooSmall                   400  (form uploads: under content-length-range)
    ├── EntityTooLarge                   400  (form uploads: over content-length-range)
    ├── NoSuchModel                      404
    ├── MethodNotAllowed                 405  (the method is not an operation of the resource)
    ├── UnprocessableObject              422
    ├── RequestHeaderSectionTooLarge     431  (the request head is over the limit)
    ├── InsufficientMemory               503  (one sample does not fit the memory budget)
    ├── SlowDown                         503  (with Retry-After)
    ├── ServiceUnavailable               503  (with Retry-After; backend unreachable)
    ├── DecodeUnavailable                503  (ServiceUnavailable, with Retry-After: a decode
    │                                          worker process died with the sample)
    └── BackendError                     the backend's own error, code and status as it sent them

Third-party errors are wrapped where they enter (``raise ServiceUnavailable(...) from exc``).
"""

from __future__ import annotations


class S3Error(Exception):
    """An error the gateway reports to its client as S3 XML.

    Args:
        message: Human-readable explanation, sent as ``<Message>``.
        resource: The bucket/key the error concerns, sent as ``<Resource>``.
        retry_after: Seconds, sent as ``Retry-After`` for 503s.
    """

    code: str = "InternalError"
    status: int = 500

    def __init__(self, message: str, *, resource: str = "", retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.resource = resource
        self.retry_after = retry_after


class AccessDenied(S3Error):
    """The credentials do not allow the request."""

    code = "AccessDenied"
    status = 403


class InvalidAccessKeyId(S3Error):
    """The access key id is not one the gateway knows."""

    code = "InvalidAccessKeyId"
    status = 403


class SignatureDoesNotMatch(S3Error):
    """The request's signature does not match the one computed."""

    code = "SignatureDoesNotMatch"
    status = 403


class RequestTimeTooSkewed(S3Error):
    """The request's date is too far from the gateway's clock."""

    code = "RequestTimeTooSkewed"
    status = 403


class AuthorizationHeaderMalformed(S3Error):
    """The Authorization header cannot be parsed."""

    code = "AuthorizationHeaderMalformed"
    status = 400


class AuthorizationQueryParametersError(S3Error):
    """The presigned query parameters are malformed or expired."""

    code = "AuthorizationQueryParametersError"
    status = 400


class XAmzContentSHA256Mismatch(S3Error):
    """The body's SHA-256 differs from x-amz-content-sha256."""

    code = "XAmzContentSHA256Mismatch"
    status = 400


class BadDigest(S3Error):
    """A checksum (header or trailer) does not match the body."""

    code = "BadDigest"
    status = 400


class InvalidDigest(S3Error):
    """The Content-MD5 header is not a base64 digest."""

    code = "InvalidDigest"
    status = 400


class IncompleteBody(S3Error):
    """The body ended before its declared length."""

    code = "IncompleteBody"
    status = 400


class InvalidRequest(S3Error):
    """The request is malformed."""

    code = "InvalidRequest"
    status = 400


class InvalidArgument(S3Error):
    """A parameter has an invalid value."""

    code = "InvalidArgument"
    status = 400


class InvalidBucketName(S3Error):
    """The bucket named is not a valid S3 bucket name."""

    code = "InvalidBucketName"
    status = 400


class MethodNotAllowed(S3Error):
    """The method is not an operation of the resource it addresses."""

    code = "MethodNotAllowed"
    status = 405


class NoSuchModel(S3Error):
    """The registry has no such model or version."""

    code = "NoSuchModel"
    status = 404


class UnprocessableObject(S3Error):
    """The object is not a decodable image or shard."""

    code = "UnprocessableObject"
    status = 422


class RequestHeaderSectionTooLarge(S3Error):
    """The request head is larger than the gateway accepts."""

    code = "RequestHeaderSectionTooLarge"
    status = 431


class SlowDown(S3Error):
    """The gateway is saturated; retry after the given delay."""

    code = "SlowDown"
    status = 503


class ServiceUnavailable(S3Error):
    """The backend store cannot be reached."""

    code = "ServiceUnavailable"
    status = 503


class DecodeUnavailable(S3Error):
    """A decode worker process died while it held one of the request's samples; the
    worker is replaced, so a retry is served."""

    code = "ServiceUnavailable"
    status = 503


class InsufficientMemory(S3Error):
    """One sample alone does not fit the storage side's memory budget."""

    code = "InsufficientMemory"
    status = 503


class BackendError(S3Error):
    """An error the backend returned for a request the gateway made on its own behalf.

    Args:
        code: The backend's S3 error code (``NoSuchKey``...).
        status: The backend's HTTP status.
    """

    def __init__(self, code: str, status: int, message: str, *, resource: str = "") -> None:
        super().__init__(message, resource=resource)
        self.code = code
        self.status = status


class MalformedPOSTRequest(S3Error):
    """A form upload's body is not well-formed multipart/form-data."""

    code = "MalformedPOSTRequest"
    status = 400


class InvalidPolicyDocument(S3Error):
    """A form upload's policy cannot be read."""

    code = "InvalidPolicyDocument"
    status = 400


class MissingFields(S3Error):
    """A form upload signed the V2 way lacks its access key id, policy or signature."""

    code = "MissingFields"
    status = 400


class MaxPostPreDataLengthExceeded(S3Error):
    """A form upload's fields before the file are too large."""

    code = "MaxPostPreDataLengthExceededError"
    status = 400


class EntityTooSmall(S3Error):
    """A form upload's file is smaller than its policy's content-length-range allows."""

    code = "EntityTooSmall"
    status = 400


class EntityTooLarge(S3Error):
    """A form upload's file is larger than its policy's content-length-range allows."""

    code = "EntityTooLarge"
    status = 400

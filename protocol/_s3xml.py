"""S3's XML, read once: error replies and ListObjectsV2 pages.

Every package that talks S3 without botocore (the gateway to its store, the SDK for the
requests botocore does not model) reads replies with these, so an error's code and message,
and a listing's keys and continuation token, are parsed the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from xml.etree import ElementTree

from ._errors import InvalidValue

NAMESPACE = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(frozen=True)
class ErrorReply:
    """An S3 error reply: ``<Error><Code>..</Code><Message>..</Message></Error>``.

    ``code`` is empty when the body is not S3 XML (a proxy's HTML page, a truncated body);
    ``message`` then holds the start of the body, so the cause stays readable.
    """

    code: str
    message: str


def parse_error(body: bytes) -> ErrorReply:
    """The code and message of an S3 error body (never raises)."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return ErrorReply("", body[:200].decode(errors="replace"))
    return ErrorReply(root.findtext("Code") or "", root.findtext("Message") or "")


@dataclass(frozen=True)
class ListedObject:
    """One ``<Contents>`` of a listing."""

    key: str
    size: int
    last_modified: datetime | None


@dataclass(frozen=True)
class ListPage:
    """One page of ListObjectsV2: its objects, and the token of the next page (``None``
    on the last one)."""

    objects: tuple[ListedObject, ...]
    next_token: str | None


def parse_list_page(body: bytes) -> ListPage:
    """One ListObjectsV2 reply.

    Raises:
        InvalidValue: The body is not XML.
    """
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise InvalidValue(f"not a ListObjectsV2 reply: {exc}") from exc
    objects = tuple(
        ListedObject(
            key=item.findtext(f"{NAMESPACE}Key") or "",
            size=int(item.findtext(f"{NAMESPACE}Size") or 0),
            last_modified=_timestamp(item.findtext(f"{NAMESPACE}LastModified")),
        )
        for item in root.iter(f"{NAMESPACE}Contents")
    )
    token = root.findtext(f"{NAMESPACE}NextContinuationToken")
    truncated = root.findtext(f"{NAMESPACE}IsTruncated") == "true"
    return ListPage(objects, token if truncated and token else None)


def _timestamp(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None

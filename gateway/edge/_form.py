"""multipart/form-data, read as it arrives: the fields before the file, then the file's bytes.

An S3 form upload puts its fields (key, policy, signature, metadata) before the file, and
ignores whatever follows it, so the reader needs to hold only the fields and one read of the
body: the file streams through. Format: RFC 7578 (and RFC 2046, section 5.1.1).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .._errors import MalformedPOSTRequest, MaxPostPreDataLengthExceeded

__all__ = ["FilePart", "FormReader", "form_boundary"]

_MAX_PART_HEAD = 16 * 1024
_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,70})"|([^;\s]{1,70}))', re.IGNORECASE)
_PARAM = re.compile(r';\s*([A-Za-z*]+)="((?:[^"\\]|\\.)*)"|;\s*([A-Za-z*]+)=([^;\s]*)')


@dataclass(frozen=True, slots=True)
class FilePart:
    """The file field of a form: what the browser says of it."""

    filename: str
    content_type: str


def form_boundary(content_type: str) -> bytes | None:
    """The boundary of a ``multipart/form-data`` Content-Type; None for any other type."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        return None
    match = _BOUNDARY.search(params)
    if match is None:
        return None
    return (match.group(1) or match.group(2)).encode("latin-1")


class FormReader:
    """Reads one multipart/form-data body from an async iterator of its bytes.

    Args:
        source: The body, in reads of any size.
        boundary: From the Content-Type (:func:`form_boundary`).
        max_fields_bytes: The most bytes the fields before the file may take.
    """

    def __init__(
        self, source: AsyncIterator[bytes], boundary: bytes, *, max_fields_bytes: int
    ) -> None:
        self._source = source
        self._delimiter = b"\r\n--" + boundary
        # The body's first delimiter has no CRLF before it: add one so that all look alike.
        self._buffer = bytearray(b"\r\n")
        self._max_fields_bytes = max_fields_bytes
        self._fields_bytes = 0
        self.received = bytearray()  # what has been read so far, kept until the file
        self.exhausted = False

    async def fields(self) -> tuple[dict[str, str], FilePart | None]:
        """The fields before the file (names lowercased, first value wins), and the file.

        Raises:
            MalformedPOSTRequest: The body is not multipart/form-data.
            MaxPostPreDataLengthExceeded: The fields are larger than allowed.
        """
        await self._until_delimiter(preamble=True)
        fields: dict[str, str] = {}
        while await self._next_part():
            name, filename, content_type = await self._part_head()
            if name.lower() == "file":
                return fields, FilePart(filename or "", content_type)
            value = await self._until_delimiter(preamble=False)
            try:
                fields.setdefault(name.lower(), value.decode("utf-8"))
            except UnicodeDecodeError:
                raise MalformedPOSTRequest(f"The form field {name!r} is not UTF-8.") from None
        return fields, None

    async def file(self) -> AsyncIterator[bytes]:
        """The file's bytes, never an empty piece; call after :meth:`fields` found it.

        Raises:
            MalformedPOSTRequest: The body ends before the file's closing boundary.
        """
        self.received = bytearray()
        keep = len(self._delimiter) - 1  # a delimiter may straddle two reads
        while True:
            end = self._buffer.find(self._delimiter)
            if end >= 0:
                if end:
                    yield bytes(self._buffer[:end])
                del self._buffer[: end + len(self._delimiter)]
                return
            if len(self._buffer) > keep:
                piece = bytes(self._buffer[:-keep])
                del self._buffer[:-keep]
                yield piece
            if not await self._fill(record=False):
                raise MalformedPOSTRequest("The form ends inside its file field.")

    async def rest(self, limit: int) -> bool:
        """Read and drop what follows the file (S3 ignores it), up to ``limit`` bytes.

        Returns:
            Whether the body was read to its end.
        """
        dropped = len(self._buffer)
        self._buffer.clear()
        while dropped <= limit:
            if not await self._fill(record=False):
                return True
            dropped += len(self._buffer)
            self._buffer.clear()
        return False

    async def _fill(self, *, record: bool = True) -> bool:
        if self.exhausted:
            return False
        try:
            chunk = await anext(self._source)
        except StopAsyncIteration:
            self.exhausted = True
            return False
        self._buffer += chunk
        if record:
            self.received += chunk
        return True

    async def _until_delimiter(self, *, preamble: bool) -> bytes:
        """The bytes up to the next delimiter, which is consumed."""
        start = 0
        while (end := self._buffer.find(self._delimiter, start)) < 0:
            start = max(0, len(self._buffer) - len(self._delimiter) + 1)
            self._check_size(len(self._buffer))
            if not await self._fill():
                raise MalformedPOSTRequest("The form ends before its closing boundary.")
        value = bytes(self._buffer[:end])
        del self._buffer[: end + len(self._delimiter)]
        if not preamble:
            self._fields_bytes += end
            self._check_size(0)
        return value

    def _check_size(self, pending: int) -> None:
        if self._fields_bytes + pending > self._max_fields_bytes:
            raise MaxPostPreDataLengthExceeded(
                "Your POST request fields preceding the upload file were too large."
            )

    async def _next_part(self) -> bool:
        """After a delimiter: True if a part follows, False at the closing one."""
        while len(self._buffer) < 2:
            if not await self._fill():
                raise MalformedPOSTRequest("The form ends after a boundary.")
        if self._buffer.startswith(b"--"):
            return False
        while (end := self._buffer.find(b"\r\n")) < 0:
            if len(self._buffer) > 256 or not await self._fill():
                raise MalformedPOSTRequest("A form boundary line does not end.")
        if self._buffer[:end].strip(b" \t"):
            raise MalformedPOSTRequest("A form boundary is followed by other text.")
        del self._buffer[: end + 2]
        return True

    async def _part_head(self) -> tuple[str, str | None, str]:
        """Name, filename and content type from a part's headers, which are consumed."""
        while True:
            if self._buffer.startswith(b"\r\n"):
                raise MalformedPOSTRequest("A form part has no Content-Disposition.")
            end = self._buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self._buffer) > _MAX_PART_HEAD or not await self._fill():
                raise MalformedPOSTRequest("A form part's headers do not end.")
        head = bytes(self._buffer[:end]).decode("utf-8", "replace")
        del self._buffer[: end + 4]
        self._fields_bytes += end
        self._check_size(0)
        headers = {}
        for line in head.split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        disposition = headers.get("content-disposition", "")
        params = _disposition_params(disposition)
        if not disposition.lower().startswith("form-data") or "name" not in params:
            raise MalformedPOSTRequest("A form part has no form-data name.")
        return params["name"], params.get("filename"), headers.get("content-type", "")


def _disposition_params(disposition: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for match in _PARAM.finditer(disposition):
        if match.group(1) is not None:
            params.setdefault(match.group(1).lower(), re.sub(r"\\(.)", r"\1", match.group(2)))
        else:
            params.setdefault(match.group(3).lower(), match.group(4))
    return params

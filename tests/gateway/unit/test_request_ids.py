"""Request ids: unique within and across processes, in the form S3 clients print."""

from __future__ import annotations

import re

from hapi.gateway._observe import RequestIds


def test_request_ids_are_unique_and_look_like_s3s() -> None:
    first, second = RequestIds(), RequestIds()  # two processes (or two apps) of a gateway
    ids = [ids.next() for ids in (first, second) for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9A-F]{20}", value) for value in ids)

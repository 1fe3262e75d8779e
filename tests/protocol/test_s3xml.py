"""S3's XML, read once: error replies and ListObjectsV2 pages."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hapi.protocol import ErrorReply, InvalidValue, parse_error, parse_list_page

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def test_an_error_reply_gives_its_code_and_message() -> None:
    error = parse_error(b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>")
    assert (error.code, error.message) == ("NoSuchKey", "gone")


def test_a_body_that_is_not_xml_keeps_its_start_as_the_message() -> None:
    error = parse_error(b"<html>bad gateway" + b"x" * 500)
    assert error.code == ""
    assert error.message.startswith("<html>bad gateway") and len(error.message) == 200
    assert parse_error(b"") == ErrorReply("", "")


def test_a_listing_page_gives_its_objects_and_the_next_token() -> None:
    body = (
        f"<ListBucketResult {NS}><IsTruncated>true</IsTruncated>"
        "<Contents><Key>a/1</Key><Size>7</Size><LastModified>2026-11-26T08:00:00.000Z"
        "</LastModified></Contents><Contents><Key>a/2</Key><Size>0</Size></Contents>"
        "<NextContinuationToken>tok</NextContinuationToken></ListBucketResult>"
    ).encode()
    page = parse_list_page(body)
    assert [(o.key, o.size) for o in page.objects] == [("a/1", 7), ("a/2", 0)]
    assert page.objects[0].last_modified == datetime(2026, 11, 26, 8, tzinfo=UTC)
    assert page.objects[1].last_modified is None
    assert page.next_token == "tok"


def test_the_last_page_has_no_next_token_even_if_the_store_sends_one() -> None:
    body = (
        f"<ListBucketResult {NS}><IsTruncated>false</IsTruncated>"
        "<NextContinuationToken>stale</NextContinuationToken></ListBucketResult>"
    ).encode()
    assert parse_list_page(body).next_token is None


def test_a_listing_that_is_not_xml_is_an_invalid_value() -> None:
    with pytest.raises(InvalidValue, match="not a ListObjectsV2 reply"):
        parse_list_page(b"<nope")

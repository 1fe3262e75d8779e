"""A response body timed where it arrives (``read_timed``), and which spans the link
estimate takes from a response (``wire_spans``)."""

from __future__ import annotations

import io
import itertools

import pytest

from hapi.sdk.client._wire import BUFFERED, FIRST_PIECE, WireSpan, read_timed
from hapi.sdk.planning._split import ClientTimes
from hapi.sdk.planning._stats import Meter, wire_spans


class _Body:
    """An HTTP body that hands out what it holds, recording each read's size."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.reads: list[int | None] = []

    def read(self, amt: int | None = None) -> bytes:
        self.reads.append(amt)
        return self._data.read(amt)


def _clock(*times: float):
    ticks = iter(times)
    return lambda: next(ticks)


@pytest.mark.parametrize(
    "size", [0, 1, FIRST_PIECE, FIRST_PIECE + BUFFERED, FIRST_PIECE + BUFFERED + 1, 2_000_000]
)
def test_the_body_is_whole_and_its_span_counts_only_what_came_after_the_first_piece(
    size: int,
) -> None:
    data = bytes(itertools.islice(itertools.cycle(range(251)), size))
    body = _Body(data)
    content, span = read_timed(body, clock=_clock(10.0, 12.5))
    assert content == data
    assert body.reads == [FIRST_PIECE, None]  # two reads, whatever the size
    assert (span.start, span.end, span.seconds) == (10.0, 12.5, 2.5)
    assert span.nbytes == max(0, size - FIRST_PIECE - BUFFERED)


def test_a_timed_body_gives_its_own_span_and_an_untimed_one_the_round_trip() -> None:
    round_trip, server_ms = (100.0, 100.5), {"total": 300.0, "infer": 200.0}
    timed = (WireSpan(0, 100.30, 100.31), WireSpan(50_000, 100.40, 100.45))
    assert wire_spans(90_000, round_trip, server_ms, timed) == [(50_000, (100.40, 100.45))]
    # Too small to time (or a caller that timed nothing): the round trip less the gateway's
    # 300 ms, with every byte.
    for untimed in ((), (WireSpan(0, 100.30, 100.31),)):
        assert wire_spans(90_000, round_trip, server_ms, untimed) == [(90_000, (100.3, 100.5))]


def test_an_epoch_measures_the_link_from_the_timed_bytes_over_their_spans() -> None:
    meter = Meter(0, total=None, progress=False)
    for start in (0.0, 1.0):  # two responses, 1 MB timed of 1.1 MB each, 10 ms apiece
        meter.record(
            samples=8,
            nbytes=1_100_000,
            split=3,
            mode="pushdown",
            server_ms={"total": 500.0},
            round_trip=(start, start + 0.6),
            wire=(WireSpan(1_000_000, start + 0.55, start + 0.56),),
        )
    stats = meter.finish()
    assert stats.bytes_received == 2_200_000 and stats.transfer_bytes == 2_000_000
    assert stats.transfer_seconds == pytest.approx(0.02)
    assert stats.bandwidth_bps == pytest.approx(2_000_000 * 8 / 0.02)


def test_a_gateway_that_dies_mid_body_fails_the_request_as_an_unreachable_endpoint() -> None:
    # A real socket that answers as a gateway would, then closes 5 KB into a 100 KB body:
    # the body is read outside botocore's send now, and its failure must still be the
    # endpoint's (failed over, then reported), not an unknown exception.
    from hapi import sdk
    from hapi.sdk.client._errors import EndpointsUnavailable
    from tests.support import cut_short_server

    head = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nx-hapi-request-id: t\r\n"
        b"Content-Type: application/x-hapi-features\r\n\r\n"
    )
    with cut_short_server(head + b"\0" * 5000) as url:
        s3 = sdk.client(
            url, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
        )
        with pytest.raises(EndpointsUnavailable) as caught:
            s3.get_features_batch(Bucket="b", Keys=["a.jpg"], model="m", split=1)
    assert url in str(caught.value), caught.value


def test_the_client_times_give_a_link_sample_only_for_a_timed_body() -> None:
    assert ClientTimes(0.1).bandwidth() is None  # nothing read (one machine)
    assert ClientTimes(0.1, wire=WireSpan(0, 1.0, 1.5)).bandwidth() is None  # too small
    assert ClientTimes(0.1, wire=WireSpan(1000, 1.0, 1.0)).bandwidth() is None  # no time
    sample = ClientTimes(0.1, wire=WireSpan(125_000, 2.0, 2.1)).bandwidth()
    assert sample is not None and sample.source == "sampled"
    assert sample.bits_per_second == pytest.approx(10e6)


@pytest.mark.parametrize("closed", [False, True], ids=["connection-dropped", "chunks-ended"])
def test_an_encoded_answer_without_its_end_frame_fails_the_endpoint(closed: bool) -> None:
    # A streamed zeros answer has no Content-Length: whether the peer died mid-chunk or
    # the chunks ended without the end frame, the request fails as a short dense body
    # does (failed over, then reported), never as fewer features.
    from hapi import sdk
    from hapi.protocol import raw_frames
    from hapi.sdk.client._errors import EndpointsUnavailable
    from tests.support import cut_short_server

    frames = b"".join(bytes(p) for p in raw_frames(b"\0" * 5000))
    chunk = b"%x\r\n" % len(frames) + frames + b"\r\n" + (b"0\r\n\r\n" if closed else b"")
    head = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nx-hapi-request-id: t\r\n"
        b"x-hapi-split: 1\r\nx-hapi-encoding: zeros\r\n"
        b"Content-Type: application/octet-stream\r\n\r\n"
    )
    with cut_short_server(head + chunk) as url:
        s3 = sdk.client(
            url, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
        )
        with pytest.raises(EndpointsUnavailable) as caught:
            s3.get_features_batch(Bucket="b", Keys=["a.jpg"], model="m", split=1)
        assert url in str(caught.value), caught.value
        with pytest.raises((EndpointsUnavailable, sdk.RequestError)) as single:
            s3.get_features(Bucket="b", Key="a.jpg", model="m", split=1)
        assert "cut short" in str(single.value) or "Connection broken" in str(single.value)


@pytest.mark.parametrize(
    ("encoding", "payload"),
    [("lz4", b"anything"), ("zeros", b"\x09\x04\x00\x00\x00abcd\xff\x04\x00\x00\x00")],
    ids=["unknown-encoding", "unknown-frame"],
)
def test_a_whole_answer_that_does_not_decode_is_an_invalid_response(
    encoding: str, payload: bytes
) -> None:
    # Whole (its length as promised) but unreadable: the gateway's fault, not the link's,
    # so it is reported at once, not retried elsewhere as a cut-short body would be.
    from hapi import sdk
    from tests.support import cut_short_server

    head = (
        f"HTTP/1.1 200 OK\r\nContent-Length: {len(payload)}\r\nx-hapi-request-id: t\r\n"
        f"x-hapi-split: 1\r\nx-hapi-encoding: {encoding}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    with cut_short_server(head + payload) as url:
        s3 = sdk.client(
            url, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
        )
        for call in (
            lambda: s3.get_features_batch(Bucket="b", Keys=["a.jpg"], model="m", split=1),
            lambda: s3.get_features(Bucket="b", Key="a.jpg", model="m", split=1),
        ):
            with pytest.raises(sdk.RequestError) as caught:
                call()
            assert caught.value.code == "InvalidResponse", caught.value
            assert "unreadable features" in str(caught.value)

"""A gateway decoding with DALI (``--decoder dali-cpu``, DALI's CPU mode) beside one
decoding with Pillow, in front of the same store and cache: features within the documented
tolerance, and never an entry of one decoder served by the other."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from skimage import data as samples

from hapi.gateway import GatewaySettings
from hapi.gateway.pushdown._decoders import chosen_decoder
from hapi.models import cuda_usable
from hapi.models._dali import FEATURE_P99
from hapi.protocol import Credentials
from hapi.protocol import decode_features as decode
from tests.support import RunningGateway, encode_image, signed_headers, store_gateway, wait_for


@pytest.fixture(scope="module")
def dali_gateway(store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with store_gateway(
        store,
        tmp_path_factory.mktemp("dali-gateway"),
        extra_args=("--decoder", "dali-cpu"),
    ) as running:
        yield running


def _get(gw: RunningGateway, bucket: str, key: str) -> httpx.Response:
    path = f"/{bucket}/{key}?hapi-model=r18&hapi-split=3"
    reply = httpx.get(
        gw.endpoint_url + path, headers=signed_headers(gw, "GET", path, body=b""), timeout=120
    )
    assert reply.status_code == 200, reply.text
    return reply


def _features(reply: httpx.Response) -> np.ndarray:
    tensors, _ = decode(reply.content)
    return np.asarray(tensors["features"])


def test_each_decoder_has_its_own_entries_and_they_agree_within_tolerance(
    gateway, dali_gateway, registered, backend_s3, unique_bucket
) -> None:
    backend_s3.put_object(
        Bucket=unique_bucket, Key="cat.jpg", Body=encode_image(samples.chelsea(), "JPEG")
    )
    pillow = _get(gateway, unique_bucket, "cat.jpg")
    assert pillow.headers["x-hapi-cache"] == "miss"
    wait_for(
        lambda: _get(gateway, unique_bucket, "cat.jpg").headers["x-hapi-cache"] == "hit",
        "Pillow's entry",
    )
    dali = _get(dali_gateway, unique_bucket, "cat.jpg")
    assert dali.headers["x-hapi-cache"] == "miss"  # Pillow's entry does not answer for DALI
    wait_for(
        lambda: _get(dali_gateway, unique_bucket, "cat.jpg").headers["x-hapi-cache"] == "hit",
        "DALI's entry",
    )
    dali_hit = _get(dali_gateway, unique_bucket, "cat.jpg")
    pillow_hit = _get(gateway, unique_bucket, "cat.jpg")
    np.testing.assert_array_equal(_features(dali_hit), _features(dali))
    np.testing.assert_array_equal(_features(pillow_hit), _features(pillow))
    reference, features = _features(pillow), _features(dali)
    assert not np.array_equal(features, reference)  # decoded another way
    share = np.quantile(np.abs(features - reference), 0.99) / np.abs(reference).max()
    assert share <= FEATURE_P99


def _settings(decoder: str) -> GatewaySettings:
    return GatewaySettings(
        backend_url="http://store", backend_credentials=Credentials("K", "S"), decoder=decoder
    )


def test_the_decoder_setting_is_checked() -> None:
    assert chosen_decoder(_settings("pil")) == "pil"
    assert chosen_decoder(_settings("dali-cpu")) == "dali-cpu"
    expected = "dali-gpu" if cuda_usable() else "pil"
    assert chosen_decoder(_settings("auto")) == expected
    with pytest.raises(ValueError, match="decoder must be auto, pil, dali-cpu, dali-gpu"):
        _settings("nvjpeg")
    if not cuda_usable():
        with pytest.raises(ValueError, match="dali-gpu needs a usable CUDA GPU"):
            chosen_decoder(_settings("dali-gpu"))


def test_a_dali_gateway_refuses_augmentation_before_fetching(
    dali_gateway, registered, unique_bucket
) -> None:
    # DALI's crops and colour adjustments are not torchvision's pixels: a clear 400, and
    # on a key that does not exist, so the refusal came before any fetch.
    path = f"/{unique_bucket}/absent.jpg?hapi-model=r18&hapi-split=3&hapi-augment=flip%28p%3D0.5%29"
    reply = httpx.get(
        dali_gateway.endpoint_url + path,
        headers=signed_headers(dali_gateway, "GET", path, body=b""),
        timeout=120,
    )
    assert reply.status_code == 400, reply.text
    assert "<Code>InvalidArgument</Code>" in reply.text
    assert "x-hapi-augment" in reply.text and "dali-cpu" in reply.text

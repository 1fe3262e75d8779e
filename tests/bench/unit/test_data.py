"""The dataset generator: ImageNet-like JPEGs in class folders, and WebDataset shards."""

from __future__ import annotations

import io
import tarfile

import pytest
from PIL import Image

from hapi import models
from hapi.models import testing
from hapi.models._decode import decode_object
from hapi_bench.testbed import _data


@pytest.fixture(scope="module")
def samples() -> list[_data.Sample]:
    return _data.generate(24, models.sample_images(), seed=3)


def test_images_are_jpegs_of_224_to_500_pixels(samples: list[_data.Sample]) -> None:
    for sample in samples:
        with Image.open(io.BytesIO(sample.data)) as image:
            assert image.format == "JPEG"
            assert all(224 <= side <= 500 for side in image.size), image.size


def test_sizes_vary_like_photos_do(samples: list[_data.Sample]) -> None:
    sizes = {Image.open(io.BytesIO(s.data)).size for s in samples}
    lengths = [len(s.data) for s in samples]

    assert len(sizes) > len(samples) // 2
    assert 5_000 < sum(lengths) / len(lengths) < 200_000


def test_classes_are_folders_round_robin_over_the_photos(samples: list[_data.Sample]) -> None:
    assert samples[0].key == "images/cat/00000.jpg"
    assert samples[5].key == "images/astronaut/00005.jpg"
    assert [s.label for s in samples[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert all(s.key.split("/")[1] == _data.CLASSES[s.label] for s in samples)


def test_generation_is_deterministic_per_seed(samples: list[_data.Sample]) -> None:
    photos = models.sample_images()

    assert _data.generate(3, photos, seed=3) == samples[:3]
    assert _data.generate(3, photos, seed=4)[0].data != samples[0].data


def test_shards_follow_the_webdataset_convention(samples: list[_data.Sample]) -> None:
    shards = _data.shards(samples, per_shard=10)

    assert [key for key, _ in shards] == [f"shards/shard-{n:04d}.tar" for n in range(3)]
    with tarfile.open(fileobj=io.BytesIO(shards[0][1])) as tar:
        names = tar.getnames()
    assert names[:4] == [
        "cat/00000.jpg",
        "cat/00000.cls",
        "astronaut/00001.jpg",
        "astronaut/00001.cls",
    ]


def test_the_gateways_decoder_reads_a_shard_with_its_labels(samples: list[_data.Sample]) -> None:
    key, data = _data.shards(samples, per_shard=8)[0]

    decoded = decode_object(data, testing.get_preset("imagenet"), key=key)

    assert [s.label for s in decoded] == [s.label for s in samples[:8]]
    assert decoded[0].array.shape == (3, 224, 224)


def test_generate_refuses_nothing_to_make() -> None:
    with pytest.raises(ValueError):
        _data.generate(0, models.sample_images())

"""hapi.sdk measures for the planner: what one GET costs the client's CPU, and the frozen
blocks' time here, against the real store."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hapi import planner, sdk


class _Counting:
    """A boto3 client that counts its GETs."""

    def __init__(self, s3: Any) -> None:
        self._s3 = s3
        self.gets = 0

    def get_object(self, **kwargs: Any) -> Any:
        self.gets += 1
        return self._s3.get_object(**kwargs)


def test_a_get_costs_cpu_time_and_the_runs_are_counted(backend_s3: Any, bucket: str) -> None:
    backend_s3.put_object(Bucket=bucket, Key="object.bin", Body=b"x" * 30_000)
    counting = _Counting(backend_s3)
    ms = sdk.measure_request_ms(counting, bucket, "object.bin", runs=5)
    assert counting.gets == 6  # one warm-up, five timed
    assert 0 < ms < 1000  # signing and parsing take CPU; a second would be absurd


def test_runs_must_be_positive(backend_s3: Any, bucket: str) -> None:
    with pytest.raises(planner.InvalidInput, match="runs"):
        sdk.measure_request_ms(backend_s3, bucket, "object.bin", runs=0)


def test_client_blocks_are_timed_on_given_samples(backend_s3: Any, registered: Any) -> None:
    from hapi import models

    manifest = registered["r18"]
    samples = np.random.default_rng(0).standard_normal((1, *manifest.input.shape), np.float32)
    times = sdk.measure_client_blocks(
        models.Registry(backend_s3), manifest, batch_size=2, runs=1, inputs=samples
    )
    assert len(times) == manifest.freeze and all(ms > 0 for ms in times)
    with pytest.raises(planner.InvalidInput, match="at least one sample"):
        sdk.measure_client_blocks(models.Registry(backend_s3), manifest, inputs=samples[:0])


def test_client_blocks_report_their_outputs_zeros(backend_s3: Any, registered: Any) -> None:
    # The share of zero values each block's real output holds, as onnxruntime computes
    # it here: after a ReLU about half; never outside [0, 1].
    from hapi import models
    from hapi.sdk.planning._measure import run_client_blocks

    manifest = registered["r18"]
    registry = models.Registry(backend_s3)
    times, zeros = run_client_blocks(registry, manifest, batch_size=2, runs=1)
    assert len(times) == len(zeros) == manifest.freeze
    assert all(0.0 <= z <= 1.0 for z in zeros)
    want = []
    batch = models.preprocess_batch(models.sample_images()[:2], manifest.preprocess)
    for index in range(manifest.freeze):
        session = models.create_session(registry.load_blocks(manifest, index, index + 1), None)
        batch = np.asarray(session.run(None, {session.get_inputs()[0].name: batch})[0])
        want.append(float(np.mean(batch == 0)))
    assert zeros == pytest.approx(want)
    assert max(zeros) > 0.2  # ReLUs zero a good share somewhere in ResNet18

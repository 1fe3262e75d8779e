"""Same samples in the same order: the sampler every loader shares, and the check."""

from __future__ import annotations

import numpy as np

from hapi_bench.headtohead._loaders import EpochSampler, epoch_order, label_of
from hapi_bench.headtohead._same import Trace, check, compare


def _trace(labels: list[int], rows: np.ndarray) -> Trace:
    trace = Trace()
    trace.add(rows, np.asarray(labels))
    return trace


def test_the_order_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    first = epoch_order(50, seed=3, epoch=1)
    assert sorted(first) == list(range(50))
    assert epoch_order(50, seed=3, epoch=1) == first
    assert epoch_order(50, seed=3, epoch=2) != first
    assert epoch_order(50, seed=4, epoch=1) != first


def test_two_samplers_of_one_seed_agree_epoch_by_epoch_and_the_limit_cuts_a_pass() -> None:
    a, b = EpochSampler(20, seed=0), EpochSampler(20, seed=0)
    for epoch in (1, 2, 3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert list(a) == list(b) == epoch_order(20, 0, epoch)
    a.limit = 4
    assert list(a) == epoch_order(20, 0, 3)[:4]
    assert len(a) == 20


def test_labels_follow_imagefolder_order() -> None:
    # torchvision's ImageFolder (and hapi's labels="folder") number sorted folders.
    assert [label_of(f"images/{c}/0.jpg") for c in ("astronaut", "cat", "coffee", "rocket")] == [
        0,
        1,
        2,
        3,
    ]


def test_equal_samples_within_rounding_agree() -> None:
    rows = np.random.default_rng(0).normal(size=(6, 40)).astype(np.float32)
    reference = _trace([0, 1, 2, 3, 0, 1], rows)
    assert compare(reference, _trace([0, 1, 2, 3, 0, 1], rows + 1e-5)) is None


def test_a_swapped_pair_of_one_class_shows_in_the_features() -> None:
    rows = np.random.default_rng(0).normal(size=(4, 40)).astype(np.float32)
    reference = _trace([0, 1, 0, 1], rows)
    swapped = _trace([0, 1, 0, 1], rows[[2, 1, 0, 3]])
    found = compare(reference, swapped)
    assert found is not None and found.startswith("sample 0: features differ")


def test_a_different_label_or_count_is_reported() -> None:
    rows = np.zeros((3, 8), dtype=np.float32)
    reference = _trace([0, 1, 2], rows)
    assert compare(reference, _trace([0, 2, 2], rows)) == "sample 1: label 2, the reference has 1"
    assert compare(reference, _trace([0, 1], rows[:2])) == "2 samples where the reference has 3"


def test_check_names_each_loader_and_epoch_that_differs() -> None:
    rows = np.ones((2, 8), dtype=np.float32)
    good, bad = _trace([0, 1], rows), _trace([1, 0], rows)
    traces = {"ref": {1: good, 2: good}, "a": {1: good, 2: good}, "b": {1: good, 2: bad}}
    assert check({"ref": traces["ref"], "a": traces["a"]}, "ref") is None
    found = check(traces, "ref")
    assert found is not None and found.startswith("b epoch 2: sample 0: label 1")


def test_a_trace_keeps_a_fingerprint_per_sample() -> None:
    trace = Trace()
    trace.add(np.arange(2 * 3 * 10, dtype=np.float32).reshape(2, 3, 10), [1, 2])
    assert trace.labels == [1, 2]
    assert [p.shape for p in trace.prints] == [(16,), (16,)]

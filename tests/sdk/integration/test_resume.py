"""Stopping and resuming a job against the real gateway: equal work per rank, the shuffle,
positions that torchdata's StatefulDataLoader saves and restores, and a real DDP training
job killed with SIGKILL and resumed on 2, 1 and 3 ranks, each sample of the epoch once."""

from __future__ import annotations

import io
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from hapi import planner, sdk
from tests.sdk.support import picture
from tests.support import empty_bucket, free_port

# torchdata 0.11 calls torch.set_vital, which torch 2.14 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

ROOT = Path(__file__).resolve().parents[3]
IMAGES = 13  # awkward for 2, 3 and 4 ranks
SHARDS = (5, 3)  # fewer shards than ranks x workers
MANY = (6, 6, 6, 6)  # for the shuffle


def _shard(prefix: str, count: int, label: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for n in range(count):
            members = ((f"{prefix}{n:02d}.jpg", picture("circle", 100 * label + n)),)
            for name, payload in (*members, (f"{prefix}{n:02d}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def data(backend_s3: Any) -> Iterator[str]:
    """A bucket with 13 images, two shards of 5 and 3 samples, four shards of 6."""
    bucket = f"resume-{secrets.token_hex(5)}"
    backend_s3.create_bucket(Bucket=bucket)
    for n in range(IMAGES):
        key = f"images/{n:03d}.jpg"
        backend_s3.put_object(Bucket=bucket, Key=key, Body=picture("square", n))
    for folder, counts in (("shards", SHARDS), ("many", MANY)):
        for n, count in enumerate(counts):
            body = _shard(f"s{n}-", count, n)
            backend_s3.put_object(Bucket=bucket, Key=f"{folder}/{n:02d}.tar", Body=body)
    yield bucket
    empty_bucket(backend_s3, bucket)
    backend_s3.delete_bucket(Bucket=bucket)


def _options(gateway: Any, **more: Any) -> dict[str, Any]:
    return {
        "model": "r18",
        "split": 6,  # every frozen block on the gateway: nothing runs here
        "labels": None,
        "endpoint_url": gateway.endpoint_url,
        "client_options": {
            "aws_access_key_id": gateway.access_key_id,
            "aws_secret_access_key": gateway.secret_access_key,
            "region_name": "us-east-1",
        },
        "with_info": True,
        **more,
    }


def _images(bucket: str, gateway: Any, **more: Any) -> sdk.IterableFeatureDataset:
    return sdk.IterableFeatureDataset.from_prefix(
        f"s3://{bucket}/images/", **_options(gateway, **more)
    )


def _shards(bucket: str, gateway: Any, folder: str = "shards", **more: Any) -> Any:
    more.setdefault("labels", "cls")
    return sdk.IterableFeatureDataset.from_shards(
        f"s3://{bucket}/{folder}/", **_options(gateway, **more)
    )


def _image_keys() -> list[str]:
    return [f"images/{n:03d}.jpg" for n in range(IMAGES)]


def _keys(batches: list[Any]) -> list[tuple[str, bool]]:
    return [
        (key, bool(padded))
        for _, _, info in batches
        for key, padded in zip(info["key"], info["padded"].tolist(), strict=True)
    ]


def _real(pairs: list[tuple[str, bool]]) -> Counter[str]:
    return Counter(key for key, padded in pairs if not padded)


# -- equal work per rank ----------------------------------------------------------------


@pytest.mark.parametrize("form", ["images", "shards"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_yields_as_many_batches_and_each_sample_once(
    gateway, registered, data, form, drop_last
):
    total = IMAGES if form == "images" else sum(SHARDS)
    ranks, batch = 3, 2
    batches, delivered = [], []
    for rank in range(ranks):
        build = _images if form == "images" else _shards
        dataset = build(data, gateway, rank=rank, world_size=ranks, drop_last=drop_last)
        got = list(DataLoader(dataset, batch_size=batch))
        batches.append(len(got))
        delivered += _keys(got)
        assert len(dataset) == (total // ranks if drop_last else -(-total // ranks))
    assert len(set(batches)) == 1, batches  # DDP never waits for a rank with one more
    seen = _real(delivered)
    if drop_last:
        assert max(seen.values()) == 1 and total - len(seen) < ranks
        assert not any(padded for _, padded in delivered)
    else:
        assert len(seen) == total and set(seen.values()) == {1}
        assert sum(padded for _, padded in delivered) == -(-total // ranks) * ranks - total
    if form == "shards":  # samples, not shards, are dealt: 3 ranks share 2 shards
        assert all(key.split("#")[0].endswith(".tar") for key, _ in delivered)


# -- the shuffle ------------------------------------------------------------------------


def test_shard_samples_are_shuffled_per_epoch_repeatably_in_a_bounded_buffer(
    gateway, registered, data
):
    def epoch(seed: int, number: int) -> tuple[list[str], sdk.EpochStats]:
        dataset = _shards(data, gateway, "many", shuffle=True, seed=seed, shuffle_buffer=4)
        dataset.set_epoch(number)
        keys = [key for key, _ in _keys(list(DataLoader(dataset, batch_size=5)))]
        assert dataset.stats is not None
        return keys, dataset.stats

    first, stats = epoch(1, 0)
    assert sorted(first) == sorted(f"many/{s:02d}.tar#{m}" for s in range(4) for m in range(6))
    assert epoch(1, 0)[0] == first  # the same seed and epoch repeat
    assert epoch(1, 1)[0] != first  # another epoch differs
    assert epoch(2, 0)[0] != first
    shards = [key.split("#")[0] for key in first]
    runs = sum(1 for a, b in itertools.pairwise(shards) if a != b)
    assert runs > len(MANY)  # samples of a shard do not come out together in member order
    assert stats.held_peak <= 4 + max(MANY)  # the buffer, and one shard arriving


# -- StatefulDataLoader in one process ----------------------------------------------------


@pytest.mark.parametrize("form", ["images", "shards"])
def test_a_stateful_loader_resumes_at_the_next_unseen_sample(gateway, registered, data, form):
    def build() -> sdk.IterableFeatureDataset:
        if form == "images":
            return _images(data, gateway, shuffle=True, seed=3, request_size=2)
        return _shards(data, gateway, "many", shuffle=True, seed=3, shuffle_buffer=5)

    whole = _keys(list(DataLoader(build(), batch_size=4)))
    dataset = build()
    loader = StatefulDataLoader(dataset, batch_size=4)
    first = []
    for batch in loader:
        first.append(batch)
        if len(first) == 2:
            state = loader.state_dict()  # the prefetcher has fetched ahead by now
            break
    again = build()
    resumed = StatefulDataLoader(again, batch_size=4)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert _keys(first) + _keys(rest) == whole  # the same samples, in the same order
    assert again.stats is not None and again.stats.resumed
    assert again.stats.samples == len(whole) - 8
    assert len(repr(state)) < 3000  # positions and seeds, never a list of samples


def test_workers_of_a_stateful_loader_continue_where_each_stopped(gateway, registered, data):
    # torchdata's own protocol alone: the loader's state, loaded into the loader. Not
    # "fork": this process may have run onnxruntime in earlier tests.
    def loader() -> StatefulDataLoader:
        dataset = _images(data, gateway, shuffle=True, seed=4, batch_size=2)
        options = {"num_workers": 2, "multiprocessing_context": "forkserver"}
        return StatefulDataLoader(dataset, batch_size=2, **options)

    whole = _keys(list(loader()))
    first = loader()
    taken = list(itertools.islice(first, 3))
    state = first.state_dict()
    del first
    again = loader()
    again.load_state_dict(state)
    assert _keys(taken) + _keys(list(again)) == whole  # the same batches, in the same order


def test_a_state_of_another_dataset_or_listing_is_refused(gateway, registered, backend_s3, data):
    dataset = _images(data, gateway, shuffle=True, seed=3)
    loader = StatefulDataLoader(dataset, batch_size=4)
    next(iter(loader))
    state = loader.state_dict()
    refusals = {
        "seed 3 (now 4)": _images(data, gateway, shuffle=True, seed=4),
        "model 'r18@": _images(data, gateway, shuffle=True, seed=3, model="enl0", split=5),
        "split 6 (now 'auto')": _images(data, gateway, shuffle=True, seed=3, split="auto"),
        "objects 's3://": _shards(data, gateway, shuffle=True, seed=3),
        "augment '' (now 'flip(p=0.5); views=0')": _images(
            data, gateway, shuffle=True, seed=3, augment="flip(p=0.5)"
        ),
    }
    for says, other in refusals.items():
        with pytest.raises(sdk.StateMismatch, match="another dataset") as refused:
            other.load_state_dict(state)
        assert says in str(refused.value)
    backend_s3.put_object(Bucket=data, Key="images/zz.jpg", Body=picture("square", 99))
    try:
        grown = _images(data, gateway, shuffle=True, seed=3)
        with pytest.raises(sdk.StateMismatch, match="13 samples then, 14 now"):
            grown.load_state_dict(state)
    finally:
        backend_s3.delete_object(Bucket=data, Key="images/zz.jpg")


def test_a_resumed_run_keeps_its_local_cache_planner_and_failover(
    gateway, registered, data, tmp_path
):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: requests fail over
    options = {
        "endpoint_url": [dead, gateway.endpoint_url],
        "split": "auto",
        "bandwidth": "1gbit",
        "local_cache": tmp_path,
        "request_size": 3,
        "shuffle": True,
    }
    first = _images(data, gateway, **options)
    loader = StatefulDataLoader(first, batch_size=2)
    taken = list(itertools.islice(loader, 2))
    state = loader.state_dict()
    del loader  # the prefetched requests reached the local cache before the job stopped
    again = _images(data, gateway, **options)
    again.load_state_dict(state)
    rest = list(StatefulDataLoader(again, batch_size=2))
    assert _real(_keys(taken) + _keys(rest)) == Counter(_image_keys())
    stats = again.stats
    assert stats is not None and stats.resumed and stats.samples == IMAGES - 4
    assert stats.local_samples >= 2  # fetched ahead before the stop, read from disk now
    assert again.split == first.split  # the entries are the split's: it continued at it
    assert again.split_choice.policy != "given"


def _edited(found: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``found`` (a loader's state) with ``change`` applied to each dataset state in it."""
    if isinstance(found, dict):
        if found.get("kind") == "hapi.sdk.IterableFeatureDataset":
            return change(found)
        return {key: _edited(value, change) for key, value in found.items()}
    if isinstance(found, list | tuple):
        return type(found)(_edited(value, change) for value in found)
    return found


def test_a_resumed_auto_split_continues_at_the_split_the_job_was_using(gateway, registered, data):
    options = {"split": "auto", "bandwidth": "1gbit", "request_size": 3, "shuffle": True}
    loader = StatefulDataLoader(_images(data, gateway, **options), batch_size=2)
    taken = list(itertools.islice(loader, 2))
    state = loader.state_dict()
    again = _images(data, gateway, **options)
    planned = again.split
    saved = 4 if planned is None else None  # not what this build plans, whatever it plans
    again.load_state_dict(_edited(state, lambda found: {**found, "split_in_use": saved}))
    assert again.split == saved and again.split_choice.policy == "resumed"
    assert f"this build planned split {planner.split_label(planned)}" in again.split_choice.reason
    rest = list(StatefulDataLoader(again, batch_size=2))
    assert _real(_keys(taken) + _keys(rest)) == Counter(_image_keys())
    stats = again.stats
    assert stats is not None and stats.resumed and stats.split == saved
    assert stats.mode == ("pushdown" if saved is not None else "local")
    expected = {info["key"]: row for row, _, info in _images(data, gateway, split=6)}
    for features, _, info in rest:
        for row, key in zip(features, info["key"], strict=True):
            torch.testing.assert_close(row, expected[key], rtol=1e-4, atol=1e-4)
    fresh = _images(data, gateway, **options)  # a state of an earlier release: as planned
    older = _edited(state, lambda found: {k: v for k, v in found.items() if k != "split_in_use"})
    fresh.load_state_dict(older)
    assert fresh.split_choice.policy != "resumed"


# -- the map-style form ------------------------------------------------------------------


def test_the_map_style_form_resumes_with_the_loader_s_sampler(gateway, registered, data):
    def build() -> tuple[sdk.FeatureDataset, StatefulDataLoader]:
        options = _options(gateway, labels=lambda key: int(key[-7:-4]))  # label: the index
        del options["with_info"]
        dataset = sdk.FeatureDataset.from_prefix(f"s3://{data}/images/", **options)
        torch.manual_seed(0)
        return dataset, StatefulDataLoader(dataset, batch_size=3, shuffle=True)

    _, loader = build()
    whole = [labels.tolist() for _, labels in loader]
    _, loader = build()
    iterator = iter(loader)
    first = [next(iterator)[1].tolist() for _ in range(2)]
    state = loader.state_dict()
    _, again = build()
    again.load_state_dict(state)
    assert first + [labels.tolist() for _, labels in again] == whole


# -- a real job, killed ------------------------------------------------------------------


def _job(gateway: Any, data: str, out: Path, *flags: str) -> Any:
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "tests.sdk.integration.resume_job",
        f"--uri=s3://{data}/images/",
        "--model=r18",
        "--split=6",
        f"--endpoint={gateway.endpoint_url}",
        f"--out={out}",
        "--batch=2",
        f"--port={free_port()}",
        *flags,
    ]
    env = {**os.environ, "JOB_KEY": gateway.access_key_id, "JOB_SECRET": gateway.secret_access_key}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True
    )


def _logged(out: Path) -> dict[str, list[tuple[int, str, bool]]]:
    """What each rank received: (step, key, padded)."""
    found = {}
    for log in sorted(out.glob("rank*.log")):
        rows = [line.split("\t") for line in log.read_text().splitlines()]
        found[log.stem] = [(int(step), key, padded == "1") for step, key, padded in rows]
    return found


def _kill_mid_epoch(gateway: Any, data: str, out: Path, *flags: str) -> dict[str, Any]:
    """Run a job of 2 ranks x 2 workers and SIGKILL it once its state is past step 2;
    its last state."""
    job = _job(gateway, data, out, "--ranks=2", "--workers=2", "--pause=0.2", *flags)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and job.poll() is None:
            state = out / "state.pt"
            if state.exists() and torch.load(state, weights_only=True)["step"] >= 2:
                break
            time.sleep(0.05)
        assert job.poll() is None, job.stderr.read()[-3000:]  # killed mid-epoch, not after it
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        job.wait(30)
    saved: dict[str, Any] = torch.load(out / "state.pt", weights_only=True)  # the last one
    return saved


@pytest.fixture(scope="module")
def killed(gateway, registered, data, tmp_path_factory) -> tuple[Path, list[tuple[str, bool]]]:
    """A job of 2 ranks x 2 workers, SIGKILLed mid-epoch: its last state, and the samples
    its ranks received up to that state's step."""
    out = tmp_path_factory.mktemp("killed")
    saved = _kill_mid_epoch(gateway, data, out)
    received = _logged(out)
    assert max(step for rows in received.values() for step, _, _ in rows) < 6  # mid-epoch
    before = [
        (key, padded)
        for rows in received.values()
        for step, key, padded in rows
        if step <= saved["step"]
    ]
    assert len(before) == 2 * 2 * (saved["step"] + 1)  # 2 ranks, batches of 2
    return out / "state.pt", before


@pytest.mark.parametrize(
    ("ranks", "workers"),
    # Every world size in `make test-slow` (25-40 s each); `make test` resumes a stateful
    # loader's workers (test_workers_of_a_stateful_loader_continue_where_each_stopped).
    [
        pytest.param(2, 2, marks=pytest.mark.slow),
        pytest.param(1, 2, marks=pytest.mark.slow),
        pytest.param(3, 1, marks=pytest.mark.slow),
    ],
    ids=["on-2-ranks", "on-1-rank", "on-3-ranks"],
)
def test_a_ddp_job_killed_mid_epoch_resumes_with_each_sample_once(
    gateway, registered, data, tmp_path, killed, ranks, workers
):
    state, before = killed
    out = tmp_path / "resumed"
    flags = [f"--ranks={ranks}", f"--workers={workers}", f"--resume={state}"]
    resumed = _job(gateway, data, out, *flags)
    _, errors = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, errors[-3000:]
    received = _logged(out)
    after = [(key, padded) for rows in received.values() for _, key, padded in rows]
    seen = _real(before + after)
    assert seen == Counter(_image_keys()), seen  # every sample of the epoch exactly once
    steps = {len({step for step, _, _ in rows}) for rows in received.values()}
    assert len(received) == ranks and len(steps) == 1  # as many batches on every rank


# -- augmented views --------------------------------------------------------------------

AUGMENT = {"crop": {"scale": [0.2, 1]}, "flip": 0.5, "jitter": {"brightness": 0.3}}


def _rows(batches: list[Any]) -> dict[str, np.ndarray]:
    return {
        key: features[i].numpy()
        for features, _, info in batches
        for i, (key, padded) in enumerate(zip(info["key"], info["padded"].tolist(), strict=True))
        if not padded
    }


def test_a_job_resumed_on_another_world_size_sees_the_uninterrupted_views(
    gateway, registered, data
):
    def build(**more: Any) -> sdk.IterableFeatureDataset:
        return _images(data, gateway, shuffle=True, seed=5, request_size=2, augment=AUGMENT, **more)

    whole = build()
    whole.set_epoch(1)
    want = _rows(list(DataLoader(whole, batch_size=4)))
    before = build()
    before.set_epoch(0)
    epoch0 = _rows(list(DataLoader(before, batch_size=4)))
    assert all(not np.array_equal(epoch0[k], want[k]) for k in want)  # fresh views per epoch
    # Epoch 1 on one rank, stopped after two batches, then resumed on two ranks.
    dataset = build()
    dataset.set_epoch(1)
    loader = StatefulDataLoader(dataset, batch_size=4)
    first = []
    for batch in loader:
        first.append(batch)
        if len(first) == 2:
            state = loader.state_dict()
            break
    seen = _rows(first)
    for rank in range(2):
        again = build(rank=rank, world_size=2)
        again.load_state_dict(state)
        seen.update(_rows(list(DataLoader(again, batch_size=4))))
    assert sorted(seen) == sorted(want)
    for key, features in want.items():
        np.testing.assert_array_equal(seen[key], features, err_msg=key)


# -- augmented views, through a real job killed with SIGKILL --------------------------------

VIEWS_OPTIONS = json.dumps({"augment": AUGMENT, "views": 2})


def _views(out: Path, last_step: int | None = None) -> dict[str, str]:
    """key -> the digest of the features each rank received (up to ``last_step``)."""
    found: dict[str, str] = {}
    for log in sorted(out.glob("rank*.views")):
        for step, key, digest in (line.split("\t") for line in log.read_text().splitlines()):
            if last_step is None or int(step) <= last_step:
                assert found.setdefault(key, digest) == digest, key  # a key once, one view
    return found


@pytest.fixture(scope="module")
def uninterrupted_views(gateway, registered, data, tmp_path_factory) -> dict[str, str]:
    """The views (digests) of epoch 1 seen by an uninterrupted augmented job on one rank."""
    out = tmp_path_factory.mktemp("views-whole")
    job = _job(
        gateway, data, out, "--ranks=1", "--workers=1", "--digests", f"--options={VIEWS_OPTIONS}"
    )
    _, errors = job.communicate(timeout=180)
    assert job.returncode == 0, errors[-3000:]
    views = _views(out)
    assert sorted(views) == sorted(_image_keys())
    return views


@pytest.mark.slow  # 45 s a rank count: `make test-slow`
@pytest.mark.parametrize("ranks", [1, 3], ids=["on-1-rank", "on-3-ranks"])
def test_an_augmented_job_killed_mid_epoch_resumes_with_the_uninterrupted_views(
    gateway, registered, data, tmp_path, uninterrupted_views, ranks
):
    flags = ["--digests", f"--options={VIEWS_OPTIONS}"]
    saved = _kill_mid_epoch(gateway, data, tmp_path / "killed", *flags)
    seen = _views(tmp_path / "killed", saved["step"])
    assert seen, "the killed job received nothing before its last state"
    resumed = _job(
        gateway,
        data,
        tmp_path / "resumed",
        *flags,
        f"--ranks={ranks}",
        "--workers=1",
        f"--resume={tmp_path / 'killed' / 'state.pt'}",
    )
    _, errors = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, errors[-3000:]
    after = _views(tmp_path / "resumed")
    assert not set(seen) & set(after)  # nothing received twice
    seen.update(after)
    assert sorted(seen) == sorted(uninterrupted_views)  # every sample of the epoch once
    differing = [k for k, digest in seen.items() if digest != uninterrupted_views[k]]
    assert not differing, f"views differ from the uninterrupted run's: {differing}"

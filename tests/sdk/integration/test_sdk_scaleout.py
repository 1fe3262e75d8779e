"""Scale-out: three real gateway processes in front of one real store, one SDK client.

The SDK spreads an epoch's feature requests over the gateways; a gateway killed mid-epoch
costs nothing but a retry: every sample arrives exactly once, with the features a single
gateway gives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from torch.utils.data import DataLoader

from hapi import sdk
from tests.sdk.support import picture
from tests.support import RunningGateway, control_get, empty_bucket, free_port, store_gateway

SAMPLES = 36
MODEL, SPLIT = "r18", 3
# Operations a feature request is counted under in the gateway's /metrics.
FEATURE_OPERATIONS = ("GetFeatures", "HapiBatch")


@pytest.fixture(scope="module")
def images(backend_s3: Any) -> Iterator[dict[str, Any]]:
    """A bucket of distinct JPEGs; each sample's label is its index, so labels say which
    samples arrived."""
    bucket = f"scaleout-{secrets.token_hex(5)}"
    backend_s3.create_bucket(Bucket=bucket)
    keys = [f"train/{n % 3}/{n:03d}.jpg" for n in range(SAMPLES)]
    for n, key in enumerate(keys):
        backend_s3.put_object(Bucket=bucket, Key=key, Body=picture(("circle", "square")[n % 2], n))
    yield {"bucket": bucket, "keys": keys, "ids": {key: n for n, key in enumerate(keys)}}
    empty_bucket(backend_s3, bucket)
    backend_s3.delete_bucket(Bucket=bucket)


@pytest.fixture(scope="module")
def cluster(store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three gateway processes sharing the store, the registry and one client credential;
    started, and stopped, side by side."""
    root = tmp_path_factory.mktemp("scaleout")
    key, secret = "SCALEOUT" + secrets.token_hex(4).upper(), secrets.token_hex(20)
    credentials = root / "credentials.json"
    credentials.write_text(json.dumps({key: secret}))
    starting = [
        store_gateway(
            store,
            root,
            # no feature cache: these gateways must compute, so requests are in flight
            extra_args=("--credentials-file", str(credentials), "--no-cache-enabled"),
        )
        for _ in range(3)
    ]
    with contextlib.ExitStack() as stack:
        with ThreadPoolExecutor(len(starting)) as pool:
            gateways = list(pool.map(stack.enter_context, starting))
        stack.callback(_stop, gateways)
        options = {"aws_access_key_id": key, "aws_secret_access_key": secret}
        yield {"gateways": gateways, "options": {**options, "region_name": "us-east-1"}}


def _stop(gateways: list[RunningGateway]) -> None:
    """Interrupt every gateway, then wait for each (``gateway_process`` waits one by one)."""
    for gateway in gateways:
        gateway.process.send_signal(signal.SIGINT)
    for gateway in gateways:
        with contextlib.suppress(subprocess.TimeoutExpired):
            gateway.process.wait(10)


@pytest.fixture(scope="module")
def reference(
    cluster: dict[str, Any], images: dict[str, Any], registered: Any
) -> dict[int, np.ndarray]:
    """Every sample's features through the first gateway alone, by sample id."""
    dataset = _dataset(images, cluster, cluster["gateways"][0].endpoint_url)
    items = dataset.__getitems__(list(range(len(dataset))))
    return {label: features.numpy() for features, label in items}


def _dataset(
    images: dict[str, Any], cluster: dict[str, Any], endpoint_url: Any, **options: Any
) -> Any:
    form = options.pop("form", sdk.FeatureDataset)
    return form.from_prefix(
        f"s3://{images['bucket']}/train/",
        model=MODEL,
        split=SPLIT,
        labels=images["ids"].__getitem__,
        endpoint_url=endpoint_url,
        client_options=cluster["options"],
        **options,
    )


def _scrape(gateway: RunningGateway) -> tuple[float, float]:
    """Feature requests the gateway has answered, and requests it is serving now (less
    this /metrics request), from its Prometheus text."""
    served, in_flight = 0.0, 0.0
    for line in control_get(gateway, "/metrics", timeout=5).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("hapi_requests_total{") and any(
            f'operation="{op}"' in name for op in FEATURE_OPERATIONS
        ):
            served += float(value)
        elif name == "hapi_requests_in_flight":
            in_flight = float(value) - 1
    return served, in_flight


def _served(gateway: RunningGateway) -> float:
    return _scrape(gateway)[0]


def _check(delivered: list[tuple[int, np.ndarray]], reference: dict[int, np.ndarray]) -> None:
    """Every sample exactly once, each with the features a single gateway gives."""
    assert Counter(label for label, _ in delivered) == Counter(range(SAMPLES))
    for label, features in delivered:
        want = reference[label]
        tolerance = 1e-4 * max(1.0, float(np.abs(want).max()))
        assert float(np.abs(features - want).max()) <= tolerance, label


def _dead_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


# -- several endpoints, one client --------------------------------------------------------


def test_endpoints_are_a_list_or_comma_separated_and_one_url_is_unchanged(monkeypatch):
    options = {"region_name": "us-east-1"}
    several = sdk.client(" http://a.example:1/, http://b.example:2", **options)
    assert several.meta.endpoint_url == "http://a.example:1"
    listed = sdk.client(["http://a.example:1", "http://b.example:2"], **options)
    assert listed.meta.endpoint_url == "http://a.example:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://c.example:3,http://d.example:4")
    assert sdk.client(**options).meta.endpoint_url == "http://c.example:3"
    assert sdk.client("http://one.example:5", **options).meta.endpoint_url == (
        "http://one.example:5"
    )
    with pytest.raises(ValueError, match="ftp://x"):
        sdk.client("http://a.example:1,ftp://x", **options)


def test_a_dead_endpoint_is_skipped_by_plain_calls_and_feature_requests(
    cluster, images, registered
):
    live = cluster["gateways"][1].endpoint_url
    s3 = sdk.client([_dead_endpoint(), live], **cluster["options"])
    bucket, key = images["bucket"], images["keys"][0]
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] > 0
    for _ in range(3):
        reply = s3.get_features_batch(bucket, images["keys"][:2], model=MODEL, split=SPLIT)
        assert reply.endpoint == live and len(reply.keys) == 2
    assert s3.get_features(bucket, key, model=MODEL, split=SPLIT).endpoint == live


def test_all_endpoints_down_is_one_error_naming_each(images, registered):
    dead = [_dead_endpoint(), _dead_endpoint()]
    s3 = sdk.client(dead, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    with pytest.raises(sdk.EndpointsUnavailable) as caught:
        s3.get_features_batch(images["bucket"], ["a.jpg"], model=MODEL, split=SPLIT)
    attempts = re.search(r"no endpoint answered in (\d+) attempts", str(caught.value))
    assert attempts and 2 <= int(attempts.group(1)) <= 10  # bounded: a few, with backoff
    assert isinstance(caught.value, sdk.RequestError) and caught.value.code == "NetworkError"
    assert set(caught.value.endpoints) == set(dead)
    for endpoint in dead:
        assert endpoint in str(caught.value)


# -- an epoch over three gateways ---------------------------------------------------------


def test_an_epoch_spreads_over_the_gateways(cluster, images, reference):
    gateways = cluster["gateways"]
    before = [_served(gateway) for gateway in gateways]
    joined = ",".join(gateway.endpoint_url for gateway in gateways)
    dataset = _dataset(images, cluster, joined, request_size=2, prefetch=4)
    delivered = []
    for features, labels in DataLoader(dataset, batch_size=8, shuffle=True):
        delivered.extend(zip(labels.tolist(), features.numpy(), strict=True))
    _check(delivered, reference)
    served = [_served(gateway) - was for gateway, was in zip(gateways, before, strict=True)]
    assert all(count > 0 for count in served), served
    assert sum(served) == SAMPLES // 2  # one request per two samples, none repeated


def test_a_gateway_killed_mid_epoch_costs_only_retries(cluster, images, reference, caplog):
    """Runs last here: it kills a gateway of the module's cluster."""
    gateways = cluster["gateways"]
    before = [_served(gateway) for gateway in gateways]
    dataset = _dataset(
        images,
        cluster,
        [gateway.endpoint_url for gateway in gateways],
        form=sdk.IterableFeatureDataset,
        request_size=2,
        prefetch=4,
    )
    delivered: list[tuple[int, np.ndarray]] = []
    killer = _Killer(gateways[2], delivered)
    with caplog.at_level(logging.WARNING, logger="hapi.sdk"):
        for step, (features, labels) in enumerate(DataLoader(dataset, batch_size=4)):
            delivered.extend(zip(labels.tolist(), features.numpy(), strict=True))
            if step == 1:  # the training loop's hook
                killer.start()
            # a training step: prefetching stays at most `prefetch` requests ahead, so the
            # epoch still has requests to send when the gateway is frozen
            time.sleep(0.1)
    killer.join()
    _check(delivered, reference)
    assert killer.in_flight, "the gateway had no request in flight when it was killed"
    assert killer.delivered < SAMPLES, "the epoch was over before the gateway was killed"
    assert killer.served > before[2]  # it had its share before it died
    assert all(_served(g) > was for g, was in zip(gateways[:2], before[:2], strict=True))
    down = [r.getMessage() for r in caplog.records if gateways[2].endpoint_url in r.getMessage()]
    assert down and "is down" in down[0], caplog.text


class _Killer(threading.Thread):
    """Freezes a gateway (SIGSTOP), waits until a request sits unanswered on one of its
    connections, then SIGKILLs it, so a request is in flight when it dies however fast
    the machine answers."""

    def __init__(self, gateway: RunningGateway, delivered: list[Any]) -> None:
        super().__init__(name="gateway-killer")
        self.gateway, self._delivered = gateway, delivered
        self.served, self.in_flight, self.delivered = 0.0, False, 0

    def run(self) -> None:
        self.served, _ = _scrape(self.gateway)
        port = urlsplit(self.gateway.endpoint_url).port
        assert port is not None
        self.gateway.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 20
        try:
            while not self.in_flight and time.monotonic() < deadline:
                self.in_flight = _requests_awaiting_answer(port) > 0
                time.sleep(0.002)
        finally:  # killed whatever happens, so the epoch never waits on a frozen gateway
            self.gateway.process.kill()
            self.delivered = len(self._delivered)
            self.gateway.process.wait()


def _requests_awaiting_answer(port: int) -> int:
    """Connections to ``port`` holding a request the server has not answered: bytes it has
    not read, or bytes received and none sent since (``ss -ti``: nothing sent yet, or
    lastrcv < lastsnd, both in milliseconds ago; ``ss`` leaves out a field that reads 0)."""
    listing = subprocess.run(
        ["ss", "-Htin", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    waiting = 0
    for head, info in zip(*[iter(listing.splitlines())] * 2, strict=False):
        fields = dict(re.findall(r"(\w+):(\d+)", info))
        unread, received = int(head.split()[0]), int(fields.get("bytes_received", 0))
        asked_since_answer = int(fields.get("lastrcv", 0)) < int(fields.get("lastsnd", 0))
        if unread or (received and (not int(fields.get("bytes_sent", 0)) or asked_since_answer)):
            waiting += 1
    return waiting

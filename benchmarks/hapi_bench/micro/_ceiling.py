"""``make bench-pushdown``: the gateway's pushdown throughput against a bare loop on the same cores.

The bare loop is the ceiling: the same JPEGs, the same ``hapi.models.decode_object``
preprocessing and the same composed blocks ``[0, split)``, with no HTTP at all. It decodes
a batch in a thread pool of one thread per core while onnxruntime (default threads) runs
the previous one, keeps that pipeline full across passes over the images, writes each
batch's outputs into a buffer of their size (as the gateway writes them out), and runs at
its best batch size (8, 16, 32 or 64, timed per cell and reported). A second reference,
*from-store*, is the same loop reading each image from the store first, over S3 with a
lean keep-alive client: the gateway's rate should be at least its. The gateway (feature cache off, one worker) is driven from wrk (a
C load generator, so the clients' CPU stays small beside the server's) by batch POSTs of 32
keys on 2 connections, and by single-object GETs on 8. For every split of each model, the
three are measured in rounds interleaved with each other (so drift in the machine's load
hits all alike); each figure is the median of the rounds, with the range beside it. A
gateway run's rate is the gateway's own count of samples answered over the run's steady
window (its first and last second left out). CPU per sample is user + system CPU (the
bare loop's own process; the gateway's, without its clients') over the samples.

With ``--decode-processes N``, a second gateway decodes in N worker processes (off the
interpreter lock) and is measured in the same rounds, as the modes ``batch-processes`` and
``single-processes``. With ``--baseline DIR`` (another checkout of hapi, e.g. from ``git
worktree add``), a gateway running that checkout's code is measured in the same rounds, as
the modes ``batch-baseline`` and ``single-baseline``: a change's effect, interleaved, on
the same cores.

Goals (issue "host work per sample and per request"), judged per cell: the gateway's CPU per
sample at most 1.1x the bare loop's for batch requests and 1.25x for single-object GETs, and
its samples/s at least the from-store reference's. Writes
``bench-pushdown.json`` (every run), ``bench-pushdown.md`` and ``bench-pushdown.png``.
Run as ``hapi-bench pushdown``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import resource
import statistics
import time
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np

from hapi import models
from hapi.gateway import sign_request
from hapi.protocol import Credentials
from hapi_bench.core._errors import BenchError
from hapi_bench.core._host import busy_seconds, cpu_model
from hapi_bench.micro._gateway import BenchGateway, bench_store
from hapi_bench.micro._pushdown import make_images
from hapi_bench.micro._wrk import (
    WrkRequest,
    cpu_seconds,
    run_wrk,
    thread_cpu_seconds,
    wrk_binary,
)

BATCH = 32
BARE_BATCHES = (8, 16, 32, 64)  # the bare loop's batch sizes tried; the fastest is kept
BATCH_CLIENTS = 2
GET_CLIENTS = 8
GOALS = {"batch": 1.1, "single": 1.25}
"""Issue "host work per sample": the gateway's CPU per sample at most this times the bare
loop's, and its samples/s at least the from-store reference's (where it was measured)."""
MODELS = ("resnet18", "efficientnet_lite0")
_BUCKET = "bench"
_WARM_S = 1.0  # each run's first and last second are left out of its window


@dataclass(frozen=True)
class Run:
    """One measurement: samples per second and CPU milliseconds per sample; for a gateway
    run, also the store's CPU milliseconds per sample (it serves the objects on the same
    cores) and the cores the whole machine kept busy."""

    samples_per_s: float
    cpu_ms_per_sample: float
    store_cpu_ms_per_sample: float | None = None
    busy_cores: float | None = None
    # a gateway run's share of its CPU on the event loop's thread (the rest: decoding
    # and the blocks on worker threads): the per-request work that batching spreads
    loop_cpu_ms_per_sample: float | None = None


class BareLoop:
    """Decode in a pool of one thread per core while onnxruntime runs the previous batch.

    The pipeline stays full across passes over the images (the next batch decodes while the
    last one of a pass runs), and every batch's outputs are written, as the gateway writes
    them, into a buffer of their size. With ``decoder`` (DALI), each batch is decoded by it
    in one call instead; with ``runtime``, the session runs where it says (``make
    bench-device``: CUDA); with ``fetch``, the items given to :meth:`epoch` are keys, each
    read from the store first (the from-store reference).
    """

    def __init__(
        self,
        manifest: models.Manifest,
        graph: Any | None,
        *,
        batch: int = BATCH,
        decoder: models.DaliDecoder | None = None,
        runtime: models.RuntimeSettings | None = None,
        fetch: Callable[[str], bytes] | None = None,
    ) -> None:
        self._preset = manifest.preprocess
        self._session = models.create_session(graph, runtime) if graph is not None else None
        self._pool = ThreadPoolExecutor(os.cpu_count() or 1)
        self.batch = batch
        self._decoder = decoder
        self._fetch = fetch
        self._sink = bytearray()

    def close(self) -> None:
        self._pool.shutdown()

    def best_batch(self, items: Sequence[Any], sizes: Sequence[int], seconds: float) -> int:
        """Time a short run at each batch size, keep the fastest; returns it."""
        rates = {}
        for size in sizes:
            self.batch = size
            self.epoch(items, 0)  # the session's first run at this size, untimed
            rates[size] = self.epoch(items, seconds).samples_per_s
        self.batch = max(rates, key=lambda size: rates[size])
        return self.batch

    def _decode(self, items: list[Any]) -> np.ndarray:
        blobs = items if self._fetch is None else list(self._pool.map(self._fetch, items))
        if self._decoder is not None:
            out = np.empty((len(blobs), *self._preset.sample_shape), np.float32)
            return self._decoder.decode(blobs, out, keys=["x"] * len(blobs))

        def one(blob: bytes) -> np.ndarray:
            (sample,) = models.decode_object(blob, self._preset, key="x")
            return sample.array

        return np.stack(list(self._pool.map(one, blobs)))

    def epoch(self, items: Sequence[Any], seconds: float) -> Run:
        """Batches of ``items``, round and round, until ``seconds`` are up (one batch at
        least); the rate and CPU over all of them."""
        size = self.batch
        batches = itertools.cycle([list(items[i : i + size]) for i in range(0, len(items), size)])
        cpu, started, done = _process_cpu(), time.perf_counter(), 0
        with ThreadPoolExecutor(1) as decoding:
            pending: Future[np.ndarray] | None = decoding.submit(self._decode, next(batches))
            while pending is not None:
                inputs = pending.result()
                more = time.perf_counter() - started < seconds
                pending = decoding.submit(self._decode, next(batches)) if more else None
                self._run(inputs)
                done += len(inputs)
        elapsed = time.perf_counter() - started
        return Run(done / elapsed, (_process_cpu() - cpu) * 1000 / done)

    def _run(self, inputs: np.ndarray) -> None:
        """Run the blocks on a batch and write its outputs out (split 0: the inputs)."""
        outputs = inputs if self._session is None else self._session.run(None, {"input": inputs})[0]
        rows = np.ascontiguousarray(outputs, np.float32)
        if len(self._sink) < rows.nbytes:
            self._sink = bytearray(rows.nbytes)
        np.frombuffer(self._sink, np.float32, rows.size)[:] = rows.ravel()


class StoreReader:
    """A lean client of the store for the from-store reference: SigV4-signed GETs over one
    keep-alive connection pool (the gateway's fetches are as lean)."""

    def __init__(self, endpoint: str, key: str, secret: str, bucket: str) -> None:
        self._endpoint = endpoint
        self._credentials = Credentials(key, secret)
        self._bucket = bucket
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        self._client = httpx.Client(timeout=60, trust_env=False, limits=limits)

    def close(self) -> None:
        self._client.close()

    def __call__(self, key: str) -> bytes:
        url = f"{self._endpoint}/{self._bucket}/{key}"
        headers = sign_request(method="GET", url=url, headers={}, credentials=self._credentials)
        reply = self._client.get(url, headers=headers)
        if reply.status_code != 200:
            raise BenchError(f"the store answered {reply.status_code} for {key}")
        return reply.content


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class GatewayDriver:
    """Drives a running gateway from wrk: batch POSTs from 2 connections, or single GETs
    from 8, each request signed (SigV4 in its headers) and replayed in turn.

    A C load generator keeps the clients' CPU off the two cores the gateway shares: 8
    Python clients reading features took as much CPU as the gateway's own host work. The
    rate is the gateway's own count of samples answered
    (``hapi_pushdown_model_samples_total``) over a window that starts after a warm-up and
    ends before wrk stops, so neither the first responses' latency nor the requests cut
    off at the end bias it; the CPU per sample is the gateway's over the same window.
    """

    def __init__(
        self,
        gw: BenchGateway,
        seconds: float,
        *,
        batch: int = BATCH,
        store_pid: int | None = None,
    ) -> None:
        self._gw = gw
        self._store_pid = store_pid
        self._batch = batch
        self._creds = Credentials(gw.key, gw.secret)
        self._seconds = seconds
        self._metrics = httpx.Client(timeout=30, trust_env=False)

    def close(self) -> None:
        self._metrics.close()

    def _signed(self, method: str, path: str, body: bytes = b"") -> WrkRequest:
        headers = sign_request(
            method=method,
            url=self._gw.url + path,
            headers={},
            credentials=self._creds,
            payload_sha256=hashlib.sha256(body).hexdigest(),
        )
        headers["Host"] = headers.pop("host")  # the spelling wrk.format looks for
        return WrkRequest(method, path, headers, body)

    def requests(self, keys: list[str], model: str, split: int, mode: str) -> list[WrkRequest]:
        """The signed requests one run cycles through (signed now: valid for 15 minutes)."""
        if mode == "batch":
            return [
                self._signed(
                    "POST",
                    f"/{_BUCKET}?hapi-batch",
                    json.dumps(
                        {
                            "keys": keys[i : i + self._batch],
                            "model": model,
                            "split": split,
                            "dtype": "float32",
                        }
                    ).encode(),
                )
                for i in range(0, len(keys), self._batch)
            ]
        return [
            self._signed("GET", f"/{_BUCKET}/{key}?hapi-model={model}&hapi-split={split}")
            for key in keys
        ]

    def warm(self, keys: list[str], model: str, split: int) -> None:
        """One batch, unmeasured: the gateway loads the blocks and builds its session."""
        (first, *_) = self.requests(keys, model, split, "batch")
        _check(
            self._metrics.post(self._gw.url + first.path, content=first.body, headers=first.headers)
        )

    def samples_answered(self) -> float:
        """The gateway's ``hapi_pushdown_model_samples_total``, summed over its labels."""
        url = self._gw.url + "/metrics"
        reply = self._metrics.get(url, headers=self._signed("GET", "/metrics").headers)
        _check(reply)
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in reply.text.splitlines()
            if line.startswith("hapi_pushdown_model_samples_total{")
        )

    def epoch(self, keys: list[str], model: str, split: int, mode: str) -> Run:
        """One run of wrk; the rate and CPU over its steady window."""
        requests = self.requests(keys, model, split, mode)
        connections = BATCH_CLIENTS if mode == "batch" else GET_CLIENTS
        margin = min(_WARM_S, self._seconds / 4)
        with ThreadPoolExecutor(1) as runner:
            load = runner.submit(
                run_wrk,
                self._gw.url,
                connections=connections,
                seconds=self._seconds,
                timeout_s=60,
                requests=requests,
            )
            time.sleep(margin)
            samples, cpu, loop, store, busy, started = (
                self.samples_answered(),
                cpu_seconds(self._gw.pid),
                thread_cpu_seconds(self._gw.pid),
                self._store_cpu(),
                busy_seconds(),
                time.perf_counter(),
            )
            time.sleep(max(0.5, self._seconds - 2 * margin))
            done = self.samples_answered() - samples
            elapsed = time.perf_counter() - started
            spent = cpu_seconds(self._gw.pid) - cpu
            loop = thread_cpu_seconds(self._gw.pid) - loop
            store = self._store_cpu() - store
            busy = busy_seconds() - busy
            result = load.result()
        if result.errors or result.non_2xx or result.timeouts or not done:
            raise BenchError(
                f"{mode} requests failed against the gateway ({model} split {split}): "
                f"{result.non_2xx} answered non-2xx, {result.errors} socket errors, "
                f"{result.timeouts} timeouts, {done:.0f} samples answered"
            )
        return Run(
            done / elapsed,
            spent * 1000 / done,
            store * 1000 / done if self._store_pid is not None else None,
            busy / elapsed,
            loop * 1000 / done,
        )

    def _store_cpu(self) -> float:
        return cpu_seconds(self._store_pid) if self._store_pid is not None else 0.0


def _check(reply: httpx.Response) -> None:
    if reply.status_code != 200:
        raise BenchError(f"the gateway answered {reply.status_code}: {reply.text[:300]}")


def run(
    out: Path,
    model_names: tuple[str, ...],
    splits: tuple[int, ...] | None,
    images: int,
    seconds: float,
    rounds: int,
    decode_processes: int = 0,
    baseline: Path | None = None,
) -> dict[str, Any]:
    """Measure every (model, split); returns and writes the results."""
    wrk_binary()  # fail before minutes of set-up, not after
    with bench_store() as bench:
        registry = models.Registry(bench.s3)
        print("exporting the models and uploading the images ...", flush=True)
        manifests = {
            name: registry.register(name, models.export_model(name, progress=False))
            for name in model_names
        }
        blobs = make_images(images)
        keys = [f"img-{i:03d}.jpg" for i in range(images)]
        bench.s3.create_bucket(Bucket=_BUCKET)
        for name, blob in zip(keys, blobs, strict=True):
            bench.s3.put_object(Bucket=_BUCKET, Key=name, Body=blob)
        with contextlib.ExitStack() as running:
            drivers = {"": _driver(running, bench, seconds, {}, "gw.log")}
            if decode_processes:
                extra = {"HAPI_DECODE_PROCESSES": str(decode_processes)}
                drivers["-processes"] = _driver(running, bench, seconds, extra, "gw-processes.log")
            if baseline is not None:
                extra = {"PYTHONPATH": str(baseline_tree(baseline, bench.tmp / "baseline"))}
                drivers["-baseline"] = _driver(running, bench, seconds, extra, "gw-baseline.log")
            reader = StoreReader(bench.store.endpoint_url, bench.key, bench.secret, _BUCKET)
            running.callback(reader.close)
            store = _Store(reader, bench.store.pid)
            cells = _measure(
                registry, manifests, splits, (blobs, keys), drivers, store, seconds, rounds
            )
    results = {
        "images": images,
        "mean_image_bytes": sum(map(len, blobs)) / len(blobs),
        "seconds_per_run": seconds,
        "load": f"wrk: batch POSTs of {BATCH} keys on {BATCH_CLIENTS} connections, single "
        f"GETs on {GET_CLIENTS}",
        "rounds": rounds,
        "decode_processes": decode_processes,
        "baseline": None if baseline is None else str(baseline),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_model(),
        "goals": GOALS,
        "cells": cells,
    }
    _report(out, results)
    return results


def _driver(
    running: contextlib.ExitStack, bench: Any, seconds: float, env: dict[str, str], log: str
) -> GatewayDriver:
    """A gateway (cache off, ``env`` added; its output in ``log``) in ``running``, and its
    driver."""
    gw = running.enter_context(bench.gateway(log, {"HAPI_CACHE_ENABLED": "false", **env}))
    driver = GatewayDriver(gw, seconds, store_pid=bench.store.pid)
    running.callback(driver.close)
    return driver


def baseline_tree(checkout: Path, scratch: Path) -> Path:
    """A folder that, first on ``PYTHONPATH``, makes ``hapi`` import from ``checkout``: a
    ``hapi`` package of links to the checkout's package folders, as its ``pyproject.toml``
    maps them (the console scripts and entry points stay the installed ones)."""
    config = tomllib.loads((checkout / "pyproject.toml").read_text())
    folders: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    root = scratch / "hapi"
    root.mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").touch()
    for package, folder in folders.items():
        _, _, name = package.partition(".")
        if not (checkout / folder).is_dir():
            raise BenchError(f"--baseline {checkout}: no folder {folder} for {package}")
        (root / name).symlink_to((checkout / folder).resolve(), target_is_directory=True)
    return scratch


class _Store(NamedTuple):
    """The store the from-store reference reads (and whose CPU it is charged)."""

    reader: StoreReader
    pid: int | None


def _from_store(bare: BareLoop, store: _Store, keys: list[str], seconds: float) -> Run:
    """The from-store reference's run: its process's CPU, and the store's, per sample."""
    before, started = cpu_seconds(store.pid) if store.pid else 0.0, time.perf_counter()
    run = bare.epoch(keys, seconds)
    spent = cpu_seconds(store.pid) - before if store.pid else None
    samples = run.samples_per_s * (time.perf_counter() - started)
    per_sample = spent * 1000 / samples if spent is not None and samples else None
    return Run(run.samples_per_s, run.cpu_ms_per_sample, per_sample)


def _measure(
    registry: models.Registry,
    manifests: dict[str, models.Manifest],
    splits: tuple[int, ...] | None,
    data: tuple[list[bytes], list[str]],
    drivers: dict[str, GatewayDriver],
    store: _Store,
    seconds: float,
    rounds: int,
) -> list[dict[str, Any]]:
    """Every cell; ``drivers`` by the suffix of their modes (``""``, ``"-processes"``)."""
    blobs, keys = data
    window = max(0.5, seconds - 2 * min(_WARM_S, seconds / 4))  # as long as the driver's
    cells = []
    for name, manifest in manifests.items():
        for split in splits if splits is not None else range(manifest.freeze + 1):
            if split > manifest.freeze:
                continue
            graph = registry.load_blocks(manifest, 0, split) if split else None
            bare = BareLoop(manifest, graph)
            reference = BareLoop(manifest, graph, fetch=store.reader)
            runs: dict[str, list[Run]] = {"bare": [], "from-store": []}
            try:
                for driver in drivers.values():
                    driver.warm(keys, name, split)  # the gateway builds its session
                best = bare.best_batch(blobs, BARE_BATCHES, min(1.5, window))
                reference.batch = best
                reference.epoch(keys, 0)
                for _ in range(rounds):
                    runs["bare"].append(bare.epoch(blobs, window))
                    runs["from-store"].append(_from_store(reference, store, keys, window))
                    for suffix, driver in drivers.items():
                        for mode in ("batch", "single"):
                            run = driver.epoch(keys, name, split, mode)
                            runs.setdefault(mode + suffix, []).append(run)
            finally:
                bare.close()
                reference.close()
            cell = _cell(name, split, runs) | {"bare_batch": best}
            cells.append(cell)
            print(_line(cell), flush=True)
    return cells


_REFERENCES = ("bare", "from-store")


def _modes(cell: dict[str, Any]) -> list[str]:
    """The gateway modes a cell measured, in the order measured."""
    return [mode for mode in cell["runs"] if mode not in _REFERENCES]


def _goal(mode: str) -> float:
    """A mode's cap on its CPU per sample, as a multiple of the bare loop's."""
    return GOALS[mode.split("-")[0]]


def _cell(model: str, split: int, runs: dict[str, list[Run]]) -> dict[str, Any]:
    def median(mode: str, field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in runs[mode]))

    bare_rate, bare_cpu = median("bare", "samples_per_s"), median("bare", "cpu_ms_per_sample")
    cell: dict[str, Any] = {
        "model": model,
        "split": split,
        "runs": {mode: [asdict(r) for r in found] for mode, found in runs.items()},
        "bare_samples_per_s": bare_rate,
        "bare_cpu_ms_per_sample": bare_cpu,
    }
    reference = None
    if runs.get("from-store"):
        reference = median("from-store", "samples_per_s")
        stores = [r.store_cpu_ms_per_sample for r in runs["from-store"]]
        known = [v for v in stores if v is not None]
        cell["from_store"] = {
            "samples_per_s": reference,
            "ratio": reference / bare_rate,
            "cpu_ms_per_sample": median("from-store", "cpu_ms_per_sample"),
            "store_cpu_ms_per_sample": statistics.median(known) if known == stores else None,
        }
    cores = os.cpu_count() or 1
    for mode in _modes(cell):
        pairs = zip(runs[mode], runs["bare"], strict=True)
        ratios = [g.samples_per_s / b.samples_per_s for g, b in pairs]
        rate, cpu = median(mode, "samples_per_s"), median(mode, "cpu_ms_per_sample")
        cell[mode] = {
            "samples_per_s": rate,
            "ratio": rate / bare_rate,
            "ratio_range": [min(ratios), max(ratios)],
            "cpu_ms_per_sample": cpu,
            "cpu_ratio": cpu / bare_cpu if bare_cpu else None,
            "meets_cpu": bool(bare_cpu) and cpu / bare_cpu <= _goal(mode),
        }
        if all(r.loop_cpu_ms_per_sample is not None for r in runs[mode]):
            cell[mode]["loop_cpu_ms_per_sample"] = median(mode, "loop_cpu_ms_per_sample")
        if reference is not None:  # the goal: at least the from-store reference's rate
            cell[mode] |= {"vs_from_store": rate / reference, "meets_from_store": rate >= reference}
        cell[mode]["meets_goal"] = cell[mode]["meets_cpu"] and cell[mode].get(
            "meets_from_store", True
        )
        if all(r.store_cpu_ms_per_sample is not None for r in runs[mode]):
            store = median(mode, "store_cpu_ms_per_sample")
            # every core busy with the gateway's and the store's work for each sample
            allowed = cores * 1000 / (cpu + store)
            cell[mode] |= {
                "store_cpu_ms_per_sample": store,
                "busy_cores": median(mode, "busy_cores"),
                "cores_allow_ratio": allowed / bare_rate,
            }
    return cell


def _line(cell: dict[str, Any]) -> str:
    def part(mode: str) -> str:
        m = cell[mode]
        low, high = m["ratio_range"]
        allowed = f", cores allow {m['cores_allow_ratio']:.2f}x" if "cores_allow_ratio" in m else ""
        versus = f", {m['vs_from_store']:.2f}x from-store" if "vs_from_store" in m else ""
        loop = (
            f" (event loop {m['loop_cpu_ms_per_sample']:.2f} ms/sample)"
            if "loop_cpu_ms_per_sample" in m
            else ""
        )
        return (
            f"{mode} {m['ratio']:.2f}x ({low:.2f}-{high:.2f}), CPU {m['cpu_ratio']:.2f}x"
            f"{loop}{allowed}{versus}"
        )

    reference = cell.get("from_store")
    store = (
        f"; from-store {reference['samples_per_s']:.1f}/s ({reference['ratio']:.2f}x)"
        if reference
        else ""
    )
    return (
        f"{cell['model']} split {cell['split']:2d}: bare {cell['bare_samples_per_s']:6.1f}/s "
        f"({cell['bare_cpu_ms_per_sample']:.1f} CPU-ms/sample, batch {cell.get('bare_batch', BATCH)})"
        f"{store}; " + "; ".join(part(mode) for mode in _modes(cell))
    )


def _report(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-pushdown.json").write_text(json.dumps(results, indent=2))
    modes = _modes(results["cells"][0]) if results["cells"] else ["batch", "single"]
    lines = [
        f"Gateway / bare loop, samples/s (median of {results['rounds']} interleaved rounds, "
        f"range); CPU per sample, gateway / bare. Runs of {results['seconds_per_run']:g} s, "
        f"{results['load']}, {results['cpu_count']} cores ({results['cpu']}). Goals: CPU per "
        f"sample at most {GOALS['batch']}x the bare loop's for batches and {GOALS['single']}x "
        "for single GETs, and samples/s at least the from-store reference's. *Cores allow*: the most the cores could serve "
        "with every one of them busy with the gateway's and the store's CPU per sample (the "
        "store serves the objects on the same cores; the bare loop reads them from memory), "
        "over the bare loop's rate.",
        "",
        "| model | split | bare samples/s | bare CPU-ms/sample | bare batch | from-store "
        "samples/s | "
        + " | ".join(f"{m} | {m} CPU | {m}: cores allow | {m} / from-store" for m in modes)
        + " |",
        "|---|---|---|---|---|---|" + "---|---|---|---|" * len(modes),
    ]
    for cell in results["cells"]:
        row = [
            cell["model"],
            str(cell["split"]),
            f"{cell['bare_samples_per_s']:.1f}",
            f"{cell['bare_cpu_ms_per_sample']:.1f}",
            str(cell.get("bare_batch", "-")),
            f"{cell['from_store']['samples_per_s']:.1f}" if "from_store" in cell else "-",
        ]
        for mode in modes:
            m = cell[mode]
            low, high = m["ratio_range"]
            allowed = f"{m['cores_allow_ratio']:.2f}x" if "cores_allow_ratio" in m else "-"
            versus = "-"
            if "vs_from_store" in m:
                versus = f"{m['vs_from_store']:.2f}x" + _missed(m["meets_from_store"])
            row += [
                f"{m['ratio']:.2f}x ({low:.2f}-{high:.2f})",
                f"{m['cpu_ratio']:.2f}x" + _missed(m["meets_cpu"]),
                allowed,
                versus,
            ]
        lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines)
    (out / "bench-pushdown.md").write_text(table + "\n")
    _plot(out / "bench-pushdown.png", results["cells"])
    print("\n" + table)
    missed = [
        f"{c['model']} split {c['split']} {mode}"
        for c in results["cells"]
        for mode in modes
        if not c[mode]["meets_goal"]
    ]
    print(
        f"\ngoals missed: {len(missed)} of {len(modes) * len(results['cells'])}"
        + (f" ({', '.join(missed)})" if missed else "")
    )


def _missed(met: bool) -> str:
    return "" if met else " (misses)"


def _plot(path: Path, cells: list[dict[str, Any]]) -> None:
    """Per model: samples/s over the bare loop's (with the from-store reference's and what
    the cores allow), and below it CPU per sample over the bare loop's, with each mode's cap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = sorted({c["model"] for c in cells})
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 7), squeeze=False)
    for column, name in enumerate(names):
        mine = [c for c in cells if c["model"] == name]
        splits = [c["split"] for c in mine]
        rates, costs = axes[0][column], axes[1][column]
        for mode, marker in zip(_modes(mine[0]), "osD^", strict=False):
            (line,) = rates.plot(
                splits, [c[mode]["ratio"] for c in mine], marker=marker, label=mode
            )
            allowed = [c for c in mine if "cores_allow_ratio" in c[mode]]
            if allowed:
                rates.plot(
                    [c["split"] for c in allowed],
                    [c[mode]["cores_allow_ratio"] for c in allowed],
                    linestyle="--",
                    color=line.get_color(),
                    label=f"{mode}: what the cores allow",
                )
            costs.plot(
                splits,
                [c[mode]["cpu_ratio"] for c in mine],
                marker=marker,
                color=line.get_color(),
                label=mode,
            )
            costs.axhline(_goal(mode), linestyle=":", linewidth=1, color=line.get_color())
        known = [c for c in mine if "from_store" in c]
        if known:
            rates.plot(
                [c["split"] for c in known],
                [c["from_store"]["ratio"] for c in known],
                color="black",
                linewidth=1,
                label="from-store reference (the floor)",
            )
        rates.set(ylabel="samples/s over the bare loop's", title=name, ylim=(0, 1.6))
        costs.set(xlabel="split", ylabel="CPU per sample over the bare loop's (dotted: cap)")
        rates.legend(fontsize="x-small", loc="upper center", ncol=2)
        costs.legend(fontsize="x-small")
        for ax in (rates, costs):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # splits are whole
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _splits(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated families")
    parser.add_argument("--splits", type=_splits, help="comma-separated splits (default: all)")
    parser.add_argument("--images", type=int, default=96, help="JPEGs (about 33 KiB each)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=6.0,
        help="length of each run (its first and last second are left out)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--decode-processes",
        type=int,
        default=0,
        help="also measure a gateway decoding in this many worker processes (0: do not)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also measure a gateway running another checkout of hapi (modes *-baseline)",
    )
    args = parser.parse_args(argv)
    if args.decode_processes < 0:
        parser.error("--decode-processes must be 0 or positive")
    if args.baseline is not None and not (args.baseline / "pyproject.toml").is_file():
        parser.error(f"--baseline {args.baseline}: not a checkout of hapi (no pyproject.toml)")
    names = tuple(n.strip() for n in args.models.split(",") if n.strip())
    run(
        args.out,
        names,
        args.splits,
        args.images,
        args.seconds,
        args.rounds,
        args.decode_processes,
        args.baseline,
    )

"""``hapi-bench cluster``: the multi-node store, by hand or as a scaling benchmark.

``up`` starts a testbed (SeaweedFS master and filer, and per storage node a volume server,
an S3 endpoint and a hapi gateway, each node in a network namespace of its own behind a
capped link and a CPU quota), pins ``s3://data/nI/`` to node I, writes the client's
settings to ``cluster.env`` and waits (``--for`` seconds at most, or until Ctrl-C), then
tears everything down. ``down`` removes what runs killed before their teardown left.
``scale`` runs one epoch of pushdown, with locality, on 1, 2 and 3 storage nodes (the
same objects, spread over the nodes) and reports samples/s, the scaling efficiency and the
bytes on every link. Needs root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

from hapi.protocol import format_bandwidth, format_bytes, parse_bandwidth
from hapi_bench.cluster._cluster import BUCKET, Epoch, Testbed, TestbedSpec
from hapi_bench.cluster._cluster_net import sweep
from hapi_bench.core._errors import BenchError, TestbedUnavailable

MAX_UP_S = 4 * 3600


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def up(args: argparse.Namespace) -> None:
    """Start a testbed, describe it, keep it up for ``--for`` seconds or until Ctrl-C."""
    spec = TestbedSpec(
        nodes=args.nodes,
        workdir=args.workdir.absolute(),
        rate_bps=args.rate,
        cpus=args.cpus,
        client_cpus=args.client_cpus,
    )
    signal.signal(signal.SIGTERM, _stop)
    with Testbed(spec) as testbed:
        cluster = testbed.cluster
        s3 = cluster.s3_client(testbed.roles[0])
        for bucket in (BUCKET, "hapi-models"):
            s3.create_bucket(Bucket=bucket)
        for role in testbed.roles:
            cluster.pin(BUCKET, f"{role}/", role)
        env = _client_env(testbed)
        print(_banner(testbed, env, _store_env(testbed)), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(min(args.seconds, MAX_UP_S))
        print("tearing down", flush=True)


def _client_env(testbed: Testbed) -> Path:
    creds = testbed.credentials
    lines = {
        "AWS_ENDPOINT_URL": ",".join(testbed.gateway_urls),
        "AWS_ACCESS_KEY_ID": creds.client_key,
        "AWS_SECRET_ACCESS_KEY": creds.client_secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "HAPI_PLACEMENT": testbed.placement,
    }
    return _write_env(testbed.spec.workdir / "cluster.env", lines)


def _store_env(testbed: Testbed) -> Path:
    """The store's own identity, for setup from this namespace (uploads, the registry)."""
    creds = testbed.credentials
    lines = {
        "AWS_ENDPOINT_URL": testbed.cluster.s3_url(testbed.roles[0]),
        "AWS_ACCESS_KEY_ID": creds.store_key,
        "AWS_SECRET_ACCESS_KEY": creds.store_secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return _write_env(testbed.spec.workdir / "store.env", lines)


def _write_env(path: Path, lines: dict[str, str]) -> Path:
    """``export NAME='value'`` lines, readable by the owner only (they hold a secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(f"export {name}='{value}'\n" for name, value in lines.items())
    return path


def _banner(testbed: Testbed, env: Path, store_env: Path) -> str:
    cluster, net = testbed.cluster, testbed.net
    rate = format_bandwidth(testbed.spec.rate_bps) if testbed.spec.rate_bps else "uncapped"
    rows = [
        f"  {role}: gateway {testbed.gateway_url(role)}  S3 {cluster.s3_url(role)}  "
        f"namespace {net.namespace(role)}"
        for role in testbed.roles
    ]
    return "\n".join(
        [
            f"cluster up: {len(testbed.roles)} storage nodes, links {rate}, "
            f"CPU {testbed.spec.cpus or 'unlimited'} cores a node",
            *rows,
            f"  master {cluster.master_url}  filer {cluster.filer_url}",
            f"  writes under s3://{BUCKET}/nI/ land on node I",
            f"  the client's settings (gateways, key, placement): {env}",
            f"  register a model (the store's own key): . {store_env} && "
            "hapi models export resnet18 --freeze 6",
            f"  run a client: ip netns exec {net.namespace('cli')} "
            f"sh -c '. {env} && exec python your_training.py'",
            "Ctrl-C tears it all down",
        ]
    )


def down(args: argparse.Namespace) -> None:
    """Remove what dead runs left behind."""
    removed = sweep()
    print("\n".join(f"removed {item}" for item in removed) or "nothing left behind")


def scale(args: argparse.Namespace) -> None:
    """One epoch with locality on each node count; a table and ``cluster-scaling.json``."""
    signal.signal(signal.SIGTERM, _stop)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for nodes in args.node_counts:
        spec = TestbedSpec(
            nodes=nodes,
            workdir=(args.out / f"work-{nodes}").absolute(),
            rate_bps=args.rate,
            cpus=args.cpus,
            client_cpus=args.client_cpus,
        )
        with Testbed(spec) as testbed:
            objects = testbed.load(args.samples, freeze=args.split, seed=args.seed)
            epoch = objects.epoch(locality=True, request_size=args.request_size, prefetch=4)
            if epoch.counts() != {n: 1 for n in range(args.samples)}:
                raise BenchError(f"{nodes} nodes: an epoch did not read every sample once")
            rows.append(ScaleRun.of(nodes, epoch, sum(objects.sizes.values())))
            print(rows[-1].line(rows[0]), flush=True)
    runs = [{**asdict(row), "samples_per_s": row.samples_per_s} for row in rows]
    result = {"config": _config(args), "runs": runs}
    (args.out / "cluster-scaling.json").write_text(json.dumps(result, indent=2) + "\n")


@dataclass(frozen=True)
class ScaleRun:
    """One node count's epoch."""

    nodes: int
    samples: int
    seconds: float
    object_bytes: int  # the objects the epoch read
    object_bytes_crossed: int  # of which crossed node links
    links: dict[str, dict[str, int]]  # role -> bytes to and from the node, objects sent

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @classmethod
    def of(cls, nodes: int, epoch: Epoch, object_total: int) -> ScaleRun:
        links = {role: asdict(counters) for role, counters in epoch.links.items()}
        return cls(nodes, epoch.samples, epoch.seconds, object_total, epoch.object_bytes, links)

    def line(self, first: ScaleRun) -> str:
        speedup = self.samples_per_s / first.samples_per_s
        sent = ", ".join(f"{r} {format_bytes(c['from_node'])}" for r, c in self.links.items())
        return (
            f"{self.nodes} nodes: {self.samples_per_s:6.1f} samples/s, {speedup:4.2f}x of "
            f"{first.nodes} (efficiency {speedup * first.nodes / self.nodes:.0%}); sent per "
            f"link: {sent}; object bytes across links {self.object_bytes_crossed}"
        )


def _config(args: argparse.Namespace) -> dict[str, object]:
    return {
        "rate_bps": args.rate,
        "cpus_per_node": args.cpus,
        "client_cpus": args.client_cpus,
        "samples": args.samples,
        "split": args.split,
        "machine_cpus": len(os.sched_getaffinity(0)),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hapi-bench cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start a testbed and keep it up")
    start.add_argument("--nodes", type=int, default=3)
    start.add_argument("--for", dest="seconds", type=float, default=3600.0)
    start.add_argument("--workdir", type=Path, default=Path("build/cluster"))
    start.set_defaults(run=up)
    commands.add_parser("down", help="remove what dead runs left").set_defaults(run=down)
    bench = commands.add_parser("scale", help="samples/s on 1, 2, 3 storage nodes")
    bench.add_argument("--node-counts", type=_counts, default=(1, 2, 3))
    bench.add_argument("--samples", type=int, default=96)
    bench.add_argument("--split", type=int, default=1, help="ResNet18 blocks on the nodes")
    bench.add_argument("--request-size", type=int, default=8)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", type=Path, default=Path("bench-results/cluster"))
    bench.set_defaults(run=scale)
    for command in (start, bench):
        command.add_argument("--rate", type=parse_bandwidth, default=None, help="link cap")
        command.add_argument("--cpus", type=float, default=0.5, help="cores per storage node")
        command.add_argument("--client-cpus", type=float, default=None)
    bench.set_defaults(rate=parse_bandwidth("20mbit"))
    return parser


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("hapi-bench cluster needs root (network namespaces, veths, tc, cgroups)")
    try:
        args.run(args)
    except TestbedUnavailable as exc:
        sys.exit(str(exc))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

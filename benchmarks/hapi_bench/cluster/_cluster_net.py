"""The multi-node testbed's network: one namespace per node on a bridge, each behind its own
shaped link, each with its own CPU quota.

Safety comes first. Before anything else is made, a blackhole route for the run's own
``/24`` (and only that: this machine's DNS resolver lives elsewhere in ``10.0.0.0/8``) goes
into the root namespace, with the largest metric, so the bridge's own route wins while the
bridge exists and no packet for a node's address can leave by the default route while a
namespace is half built or after it is gone. The namespaces have no default route at all.
Teardown removes the namespaces (their veths go with them), the bridge and the cgroups,
and the blackhole last, once nothing else of the run is left.

Names follow :mod:`._netns` (``hapi-bench-<pid>-<role>``), so a leftover is traceable to
the run that made it, and :func:`sweep` removes the leftovers of runs whose process is
gone. Roles: ``ctl`` (master and filer), ``cli`` (the training client), ``n1``..``nN``
(storage nodes). Addresses in ``10.231.X.0/24``: the bridge ``.1``, ``ctl`` ``.2``,
``cli`` ``.3``, node ``i`` ``.10+i``.

Each node's link is capped in both directions: ``tbf`` on the bridge's end (traffic to
the node; bursts of one 64 KiB packet at most, as the two-tier testbed's link, so a
response after an idle moment does not cross at the veth's speed) and ``htb`` on the
node's end (traffic from it, which lets out no such burst), whose second class counts what
the node's volume server sends (TCP from its port): the object bytes that cross the link.
The cap is a rate in bits per second; without one the classes still count, at 10 Gbit/s.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hapi_bench.core._errors import BenchError, TestbedUnavailable
from hapi_bench.testbed._netns import (
    BLACKHOLE_METRIC,
    PREFIX,
    _end,
    namespaces,
    run,
    tbf,
)

RANGE = ipaddress.IPv4Network("10.231.0.0/16")
_UNCAPPED_BPS = 10e9
_HTB_QUANTUM = "60000"
_OBJECT_CLASS, _OTHER_CLASS = "1:20", "1:10"
_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
_CFS_PERIOD_US = 100_000


_tags = itertools.count()


def next_tag() -> str:
    """This process's id, then with ``b``, ``c``... for further networks of the process."""
    n = next(_tags)
    return str(os.getpid()) + ("" if n == 0 else chr(ord("a") + n % 26))


def node_role(index: int) -> str:
    """The role of storage node ``index`` (1-based)."""
    return f"n{index}"


def pick_range(seed: int) -> ipaddress.IPv4Network:
    """A ``/24`` of :data:`RANGE` that no address or route of this machine uses yet."""
    taken = run("ip", "-o", "-4", "addr") + run("ip", "-4", "route", "show", "table", "all")
    subnets = list(RANGE.subnets(new_prefix=24))[1:-1]
    for offset in range(len(subnets)):
        subnet = subnets[(seed + offset) % len(subnets)]
        if f"{subnet.network_address}/24" not in taken and _prefix(subnet) not in taken:
            return subnet
    raise BenchError(f"no free /24 left in {RANGE}")


def _prefix(subnet: ipaddress.IPv4Network) -> str:
    return ".".join(str(subnet.network_address).split(".")[:3]) + "."


@dataclass(frozen=True)
class Counters:
    """Bytes on one node's link since it was made."""

    to_node: int  # received by the node
    from_node: int  # sent by the node
    objects: int  # sent by the node's volume server: object bytes leaving the node

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.to_node - other.to_node,
            self.from_node - other.from_node,
            self.objects - other.objects,
        )


class Network:
    """The blackhole, the bridge, a namespace and a shaped veth per role, cgroups.

    Args:
        roles: The namespaces to make (``ctl``, ``cli``, ``n1``...).
        volume_ports: Each storage role's volume server port, for the object counter.
        tag: Makes the names unique; the process id by default.
    """

    def __init__(
        self, roles: list[str], volume_ports: dict[str, int], tag: str | None = None
    ) -> None:
        self.tag = tag or next_tag()
        self.roles = list(roles)
        self.volume_ports = dict(volume_ports)
        self.subnet = pick_range(int(re.sub(r"\D", "", self.tag) or 0) + len(self.tag))
        self.bridge = f"hb{self.tag}br"[:15]
        self.cpu = CpuQuotas(self.tag)
        self._made: list[str] = []
        self._blackhole = False
        self._bridge_made = False

    # -- names and addresses -----------------------------------------------------------------

    def namespace(self, role: str) -> str:
        """The namespace of ``role``."""
        return f"{PREFIX}{self.tag}-{role}"

    def address(self, role: str) -> str:
        """The address of ``role`` on the bridge."""
        base = self.subnet.network_address
        if role == "ctl":
            return str(base + 2)
        if role == "cli":
            return str(base + 3)
        return str(base + 10 + int(role.removeprefix("n")))

    @property
    def host_address(self) -> str:
        """The root namespace's address on the bridge (setup traffic only)."""
        return str(self.subnet.network_address + 1)

    def _host_if(self, role: str) -> str:
        return f"hb{self.tag}{role}"[:15]

    def _ns_if(self, role: str) -> str:
        return f"hb{self.tag}{role}x"[:15]

    def prefix(self, role: str, cpus: float | None = None) -> tuple[str, ...]:
        """The command prefix that runs a process in ``role``'s namespace (and its CPU
        quota, when ``cpus`` is given)."""
        inside = ("ip", "netns", "exec", self.namespace(role))
        return (*self.cpu.prefix(role, cpus), *inside) if cpus else inside

    # -- making and unmaking -----------------------------------------------------------------

    def create(self) -> None:
        """The blackhole first, then the bridge, then a namespace and a veth per role.

        Raises:
            TestbedUnavailable: The kernel refused (no root, no namespaces).
        """
        try:
            run("ip", "route", "add", "blackhole", str(self.subnet), "metric", BLACKHOLE_METRIC)
            self._blackhole = True
            run("ip", "link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
            for role in self.roles:
                self._add(role)
        except BenchError as exc:
            self.destroy()
            raise TestbedUnavailable(f"cannot create the cluster's network: {exc}") from exc

    def _add(self, role: str) -> None:
        namespace, host_if, ns_if = self.namespace(role), self._host_if(role), self._ns_if(role)
        run("ip", "netns", "add", namespace)
        self._made.append(role)
        run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        run("ip", "link", "set", ns_if, "netns", namespace)
        run("ip", "link", "set", host_if, "master", self.bridge)
        run("ip", "link", "set", host_if, "up")
        self._ns(role, "ip", "addr", "add", f"{self.address(role)}/24", "dev", ns_if)
        self._ns(role, "ip", "link", "set", ns_if, "up")
        self._ns(role, "ip", "link", "set", "lo", "up")
        self.shape(role, None)

    def _ns(self, role: str, *command: str, check: bool = True) -> str:
        return run("ip", "netns", "exec", self.namespace(role), *command, check=check)

    def destroy(self, grace_s: float = 5.0) -> list[str]:
        """End every process in the namespaces, delete them, the bridge and the cgroups;
        the blackhole last, and only once nothing else is left. Safe to call twice.

        Returns:
            What could not be removed (empty when everything went).
        """
        present = set(namespaces())
        for role in reversed(self._made):
            namespace = self.namespace(role)
            if namespace in present:
                _end(functools.partial(_pids, namespace), grace_s)
                run("ip", "netns", "del", namespace, check=False)
            run("ip", "link", "del", self._host_if(role), check=False)
        self._made = []
        if self._bridge_made:
            run("ip", "link", "del", self.bridge, check=False)
            self._bridge_made = False
        self.cpu.destroy()
        left = self.leftovers()
        if self._blackhole and not left:
            run("ip", "route", "del", "blackhole", str(self.subnet), check=False)
            self._blackhole = False
        return left

    def leftovers(self) -> list[str]:
        """Namespaces, links and cgroups of this run that still exist."""
        mine = f"{PREFIX}{self.tag}-"
        left = [ns for ns in namespaces() if ns.startswith(mine)]
        links = run("ip", "-o", "link", "show", check=False)
        names = {self.bridge, *(self._host_if(role) for role in self.roles)}
        left += [name for name in re.findall(r"^\d+: ([^:@]+)", links, re.M) if name in names]
        return left + self.cpu.leftovers()

    # -- shaping and counting ----------------------------------------------------------------

    def shape(self, role: str, rate_bps: float | None) -> None:
        """Cap ``role``'s link at ``rate_bps`` both ways (``None``: no cap, counting only)."""
        rate = f"{int(rate_bps or _UNCAPPED_BPS)}bit"
        host_if, ns_if = self._host_if(role), self._ns_if(role)
        run("tc", "qdisc", "del", "dev", host_if, "root", check=False)
        if rate_bps:
            run("tc", "qdisc", "add", "dev", host_if, "root", *tbf(rate_bps))
        self._ns(role, "tc", "qdisc", "del", "dev", ns_if, "root", check=False)
        tc = ("tc",)
        self._ns(
            role, *tc, "qdisc", "add", "dev", ns_if, "root", "handle", "1:", "htb", "default", "10"
        )
        htb = ["htb", "rate", rate, "ceil", rate, "quantum", _HTB_QUANTUM]
        self._ns(role, *tc, "class", "add", "dev", ns_if, "parent", "1:", "classid", "1:1", *htb)
        for classid in (_OTHER_CLASS, _OBJECT_CLASS):
            self._ns(
                role, *tc, "class", "add", "dev", ns_if, "parent", "1:1", "classid", classid, *htb
            )
        port = self.volume_ports.get(role)
        if port is not None:
            match = [
                "u32",
                "match",
                "ip",
                "protocol",
                "6",
                "0xff",
                "match",
                "ip",
                "sport",
                str(port),
                "0xffff",
            ]
            self._ns(
                role,
                *tc,
                "filter",
                "add",
                "dev",
                ns_if,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                *match,
                "flowid",
                _OBJECT_CLASS,
            )

    def counters(self, role: str) -> Counters:
        """Bytes on ``role``'s link so far."""
        statistics = Path(f"/sys/class/net/{self._host_if(role)}/statistics")
        out = self._ns(role, "tc", "-s", "class", "show", "dev", self._ns_if(role))
        found = re.search(r"class htb 1:20 .*?\n\s*Sent (\d+) bytes", out)
        return Counters(
            to_node=int((statistics / "tx_bytes").read_text()),
            from_node=int((statistics / "rx_bytes").read_text()),
            objects=int(found.group(1)) if found else 0,
        )


def _pids(namespace: str) -> list[int]:
    return [int(pid) for pid in run("ip", "netns", "pids", namespace, check=False).split()]


class CpuQuotas:
    """A cgroup per role with a CPU quota (cgroup v2 ``cpu.max``, else v1's CFS quota).

    Args:
        tag: The run's tag (the cgroups are ``hapi-bench-<tag>-<role>``).
    """

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._made: list[Path] = []

    @staticmethod
    def root() -> tuple[Path, int] | None:
        """Where quotas can be set and the cgroup version, or ``None`` (no quotas here)."""
        controllers = _CGROUP_V2 / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return _CGROUP_V2, 2
        if (_CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
            return _CGROUP_V1_CPU, 1
        return None

    def path(self, role: str) -> Path:
        """The cgroup of ``role``.

        Raises:
            BenchError: This machine has no cgroup with a CPU controller.
        """
        found = self.root()
        if found is None:
            raise BenchError("no cgroup with a CPU controller (cgroup v2 cpu, or v1 cpu)")
        return found[0] / f"{PREFIX}{self.tag}-{role}"

    def prefix(self, role: str, cpus: float | None) -> tuple[str, ...]:
        """A command prefix that moves the command into ``role``'s cgroup (made with a quota
        of ``cpus`` cores on first use) and ``exec``s it."""
        if not cpus:
            return ()
        path = self.path(role)
        if path not in self._made:
            self._limit(path, cpus)
        procs = path / "cgroup.procs"
        return ("sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh")

    def _limit(self, path: Path, cpus: float) -> None:
        path.mkdir(exist_ok=True)
        self._made.append(path)
        quota = max(1000, int(cpus * _CFS_PERIOD_US))
        found = self.root()
        assert found is not None
        if found[1] == 2:
            (path / "cpu.max").write_text(f"{quota} {_CFS_PERIOD_US}\n")
        else:
            (path / "cpu.cfs_period_us").write_text(f"{_CFS_PERIOD_US}\n")
            (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")

    def destroy(self) -> None:
        """Remove the cgroups (their processes are gone by now)."""
        for path in reversed(self._made):
            with contextlib.suppress(OSError):
                path.rmdir()
        self._made = [path for path in self._made if path.exists()]

    def leftovers(self) -> list[str]:
        """This run's cgroups that still exist."""
        return [str(path) for path in self._made if path.exists()]


def sweep() -> list[str]:
    """Remove what runs of the cluster testbed left behind when their process died: their
    namespaces (and processes), bridges, cgroups and blackhole routes in :data:`RANGE`.

    Returns:
        What was removed.
    """
    removed: list[str] = []
    tags = {m.group(1) for ns in namespaces() if (m := re.match(rf"{PREFIX}(\d+[a-z]?)-", ns))}
    links = run("ip", "-o", "link", "show", check=False)
    tags |= set(re.findall(r"^\d+: hb(\d+[a-z]?)br[:@]", links, re.M))
    for tag in sorted(tags):
        if Path(f"/proc/{tag.rstrip('abcdefghijklmnopqrstuvwxyz')}").exists():
            continue  # the run is alive
        for ns in [ns for ns in namespaces() if ns.startswith(f"{PREFIX}{tag}-")]:
            _end(functools.partial(_pids, ns), 2.0)
            run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
        run("ip", "link", "del", f"hb{tag}br", check=False)
        found = CpuQuotas.root()
        for path in found[0].glob(f"{PREFIX}{tag}-*") if found else []:
            with contextlib.suppress(OSError):
                path.rmdir()
                removed.append(str(path))
    routes = run("ip", "-4", "route", "show", "type", "blackhole", check=False)
    for subnet in re.findall(r"blackhole (10\.231\.\d+\.0/24)", routes):
        if not _in_use(subnet):
            run("ip", "route", "del", "blackhole", subnet, check=False)
            removed.append(f"blackhole {subnet}")
    return removed


def _in_use(subnet: str) -> bool:
    """Whether a live run's bridge holds ``subnet`` (its blackhole must stay)."""
    prefix = subnet.removesuffix("0/24")
    return f"inet {prefix}" in run("ip", "-o", "-4", "addr", check=False)

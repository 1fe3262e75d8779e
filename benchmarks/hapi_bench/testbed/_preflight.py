"""Before anything is created: root, the tools, and two CPU cores to pin the tiers to."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Collection

from hapi_bench.core._errors import TestbedUnavailable

TOOLS = ("ip", "tc", "taskset")


def check_environment(
    *,
    euid: int | None = None,
    which: Callable[[str], str | None] = shutil.which,
    cpus: Collection[int] | None = None,
) -> tuple[int, int]:
    """Check what the testbed needs; return the client's and the storage tier's CPU.

    Args:
        euid: The effective user id (this process's when omitted).
        which: Finds a tool on PATH (``shutil.which``).
        cpus: The CPUs this process may run on (its affinity when omitted).

    Returns:
        ``(client_cpu, storage_cpu)``: the first two CPUs of the affinity set.

    Raises:
        TestbedUnavailable: Not root, a tool is missing, or fewer than two CPUs.
    """
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise TestbedUnavailable(
            "hapi bench needs root: it creates a network namespace and a veth pair and shapes "
            "them with tc (run it with sudo, or as root in a VM or container with CAP_NET_ADMIN)"
        )
    missing = [tool for tool in TOOLS if which(tool) is None]
    if missing:
        raise TestbedUnavailable(
            f"hapi bench needs {', '.join(missing)} on PATH "
            "(Debian/Ubuntu: apt-get install iproute2 util-linux)"
        )
    allowed = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if len(allowed) < 2:
        raise TestbedUnavailable(
            f"hapi bench pins each tier to its own CPU core; this process may use {len(allowed)}"
        )
    return allowed[0], allowed[1]

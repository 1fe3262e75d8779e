"""A storage side whose core is busy says so before it has run any block: the planner's
first plan for a fresh gateway sees the load, not a whole core."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from hapi.models import Manifest
from hapi.protocol import ModelProfile
from tests.support import control_get, store_gateway


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_busy_core_is_measured_before_any_pushdown(
    store: Any, planned_model: tuple[str, Manifest], tmp_path: Any
) -> None:
    # Before: with no block run yet the gateway served a whole core ("manifest"), so the
    # first plan on a loaded storage node pushed down where raw objects were 1.5x faster
    # (hapi bench --storage-competitor, one cell: split 19 at 6.0 s against 3.9 s).
    cpu = max(os.sched_getaffinity(0))
    pin = ("taskset", "-c", str(cpu))
    busy = subprocess.Popen([*pin, sys.executable, "-c", "while True: pass"])
    try:
        with store_gateway(
            store,
            tmp_path,
            extra_args=("--registry-bucket", planned_model[0]),
            prefix=pin,
        ) as gateway:
            reply = control_get(gateway, "/_hapi/models/r18")
            served = ModelProfile.model_validate_json(reply.content)
    finally:
        busy.kill()
        busy.wait()
    load = served.storage.load
    assert load.source == "probed" and load.samples == 1 and load.age_s is not None
    assert 0.2 < load.available < 0.75  # about half a core beside one busy loop
    assert all(block.source == "manifest" for block in served.storage.blocks)

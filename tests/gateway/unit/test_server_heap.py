"""What the serving process does to its collector once start-up is over."""

from __future__ import annotations

import gc

from hapi.gateway._server import freeze_startup_heap


def test_start_up_objects_are_frozen_and_the_young_generation_collects_less_often():
    before = gc.get_threshold()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        young, older, oldest = gc.get_threshold()
        assert young > before[0] and young >= 10_000
        assert (older, oldest) == before[1:]  # the older generations keep their ratios
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

"""The planner's recorded tests judge a pick as ``hapi bench`` reports it: their judge
(``tests.planner.recorded``, on the JSON) and the report's agree on every recording."""

from __future__ import annotations

import json
import math

import pytest

from hapi_bench.reports._report import best_run, configurations, ratio
from hapi_bench.reports._results import CellResult
from tests.planner import recorded
from tests.planner.unit.test_recorded import RECORDED


@pytest.mark.parametrize("path", sorted(RECORDED.glob("*.json")), ids=lambda path: path.stem)
def test_the_planner_tests_judge_as_the_report_does(path) -> None:
    for cell in json.loads(path.read_text())["cells"]:
        result = CellResult.from_dict(cell)
        runs, best = {run.split: run for run in configurations(result)}, best_run(result)
        judged = recorded.configurations(cell)

        assert set(judged) == set(runs)
        assert (recorded.best(cell).split, recorded.best(cell).loader) == best.key
        for split, run in runs.items():
            expected = ratio(run, best) - 1.0
            assert math.isclose(recorded.regret_of(cell, split), expected, abs_tol=1e-12)

"""The plots are real PNG files."""

from __future__ import annotations

from hapi_bench.reports import _plot
from hapi_bench.reports._results import CellResult

PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_all_writes_two_pngs(tmp_path, cells: list[CellResult]) -> None:
    paths = _plot.plot_all(tmp_path, cells)

    assert [p.name for p in paths] == ["epoch_vs_split.png", "bytes_per_sample.png"]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_several_models_get_a_panel_each(tmp_path, cells: list[CellResult]) -> None:
    other = [CellResult.from_dict({**c.to_dict(), "model": "vgg11"}) for c in cells]

    path = _plot.plot_epoch_times(tmp_path / "two.png", [*cells, *other])

    assert path.read_bytes().startswith(PNG)

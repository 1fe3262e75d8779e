"""What tests and the benchmarks reach below ``hapi.models``' public surface: the model
families' decompositions before export, building hub networks, composing raw blocks,
presets by name, a manifest's parts, checking a name, and an ONNX graph's cut points.

These are not part of the public API (``hapi.models.__all__``): they may change with the
package's internals. Until the next release, ``hapi.models.NAME`` still gives each of them,
with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

from ._cuts import cut_points
from ._families import FAMILIES, Decomposition, build
from ._hub import RandomWeightsWarning, build_hub
from ._manifest import BlockInfo, InputSpec
from ._names import check_name
from ._onnx import compose
from ._preprocess import PRESETS, get_preset

__all__ = [
    "FAMILIES",
    "PRESETS",
    "BlockInfo",
    "Decomposition",
    "InputSpec",
    "RandomWeightsWarning",
    "build",
    "build_hub",
    "check_name",
    "compose",
    "cut_points",
    "get_preset",
]

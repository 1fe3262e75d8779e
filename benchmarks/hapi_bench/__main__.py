"""``python -m hapi_bench``: the same as ``hapi bench``."""

from __future__ import annotations

from hapi_bench._cli import bench

if __name__ == "__main__":
    bench(prog_name="hapi bench")

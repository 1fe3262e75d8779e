"""Micro-benchmarks of one gateway: pass-through under wrk against nginx, pushdown against the bare loop, the device run and the load mix."""

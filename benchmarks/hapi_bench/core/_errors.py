"""The testbed's errors.

::

    BenchError                 the benchmark cannot go on (exit code 1)
    └── TestbedUnavailable     not root, ``ip``/``tc``/``taskset`` missing, one CPU core,
                               or the namespace cannot be made (exit code 2, one line)
"""

from __future__ import annotations


class BenchError(RuntimeError):
    """The benchmark cannot go on."""


class TestbedUnavailable(BenchError):
    """This machine or user cannot host the testbed; the message says what to do."""

    __test__ = False  # not a pytest test class, whatever its name says

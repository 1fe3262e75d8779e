"""The error tree of ``hapi.protocol``.

::

    ProtocolError                    base of everything raised here
    └── InvalidValue (ValueError)    a size, a bandwidth, a wire dtype or a feature
        │                            payload that does not parse
        └── CutShort                 a ``zeros`` answer that ends before its end frame

The packages above translate these at their own boundaries (the gateway's one error
handler, the CLI's), as they translate their own trees.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class of every error raised by ``hapi.protocol``."""


class InvalidValue(ProtocolError, ValueError):
    """A value on the wire or on a command line does not parse (the message says why)."""


class CutShort(InvalidValue):
    """A ``zeros`` answer that ends before its end frame: it was cut short on the way."""

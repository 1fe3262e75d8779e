"""hapi.gateway: the S3-compatible gateway (pass-through proxy and pushdown).

``create_app(settings)`` builds the ASGI app; ``hapi serve`` runs it under uvicorn.
"""

from __future__ import annotations

from ._app import Gateway, create_app
from ._cli import serve
from ._errors import S3Error
from ._server import listen, run_gateway
from ._settings import GatewaySettings
from ._sigv4 import Credentials, sign_request

__all__ = [
    "Credentials",
    "Gateway",
    "GatewaySettings",
    "S3Error",
    "create_app",
    "listen",
    "run_gateway",
    "serve",
    "sign_request",
]

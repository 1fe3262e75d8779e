"""hapi.gateway: the S3-compatible gateway (pass-through proxy and pushdown).

``create_app(settings)`` builds the ASGI app; ``hapi serve`` runs it under uvicorn.
"""

from __future__ import annotations

from ._app import Gateway, create_app
from ._cli import serve, settings_options
from ._control import ProbeMeter
from ._errors import S3Error
from ._identities import Caller, ClientKey, read_credentials_file
from ._knobs import Knob, markdown_table
from ._server import listen, run_gateway
from ._settings import GatewaySettings, environment_variables, settings_knobs
from ._signing import sign_request
from .edge._http import edge_config
from .pushdown._registry import AsyncRegistry, StoreRegistry
from .pushdown._resources import memory_budget
from .pushdown._tenants import SessionFactory

__all__ = [
    "AsyncRegistry",
    "Caller",
    "ClientKey",
    "Gateway",
    "GatewaySettings",
    "Knob",
    "ProbeMeter",
    "S3Error",
    "SessionFactory",
    "StoreRegistry",
    "create_app",
    "edge_config",
    "environment_variables",
    "listen",
    "markdown_table",
    "memory_budget",
    "read_credentials_file",
    "run_gateway",
    "serve",
    "settings_knobs",
    "settings_options",
    "sign_request",
]

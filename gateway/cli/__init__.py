"""The ``thinkgate`` command: dispatch (``main``) and one module per command group."""

from gateway.cli.main import app_from_env, main

__all__ = ["app_from_env", "main"]

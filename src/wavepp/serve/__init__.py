"""`wavepp serve`: an OpenAI-compatible HTTP front end over one Engine."""

from wavepp.openai_http import APIError
from wavepp.serve.app import ServeConfig, build_app
from wavepp.serve.server import run_server

__all__ = ["APIError", "ServeConfig", "build_app", "run_server"]

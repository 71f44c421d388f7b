"""Aspen: a drop-in replacement for `git http-backend`."""

__version__ = "0.1.0"
AGENT = f"aspen/{__version__}"

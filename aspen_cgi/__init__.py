"""Aspen: a drop-in replacement for `git http-backend`."""

try:
    from ._version import __version__       # written by the build (setuptools-scm): release and commit
except ImportError:                          # a checkout never installed
    __version__ = "0.1.0"
AGENT = f"aspen/{__version__}"

"""Aspen: a drop-in replacement for `git http-backend`."""


def __getattr__(name: str) -> str:
    """__version__ (written by the build: setuptools-scm's release and commit)
    and AGENT, read where they are used: a replayed CGI answer imports neither."""
    if name not in ("__version__", "AGENT"):
        raise AttributeError(name)
    try:
        from ._version import __version__ as version
    except ImportError:                      # a checkout never installed
        version = "0.1.0"
    globals().update(__version__=version, AGENT=f"aspen/{version}")
    return globals()[name]

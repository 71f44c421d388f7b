"""Fuzzing of everything that reads client bytes (`aspen-bench fuzz`).

Targets (each a name, a hypothesis strategy and a checked run):
parsers.py (pkt-lines, v0/v2 requests, capabilities, CGI variables,
receive-pack commands and pack headers, request bodies), pipeline.py
(handle() over a real repository), cgiprogram.py (aspen-cgi as Apache
starts it), wire.py (raw HTTP to gunicorn).
corpus.py captures real git clients' requests as seeds; runner.py drives
the targets; report.py writes the results folder."""

from __future__ import annotations

from .model import Target


def all_targets() -> list[Target]:
    from . import cgiprogram, parsers, pipeline, wire
    return [*parsers.TARGETS, *pipeline.TARGETS, *cgiprogram.TARGETS, *wire.TARGETS]


def select(names: str | None) -> list[Target]:
    """Targets by comma-separated NAMES (all when None or empty)."""
    known = {t.name: t for t in all_targets()}
    if not names:
        return list(known.values())
    out = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in known:
            raise ValueError(f"unknown fuzz target {name!r} (known: {', '.join(known)})")
        out.append(known[name])
    return out

"""The fuzz results folder: summary.json, a README.md table, and one folder
per distinct crash under crashes/ (input.json, input.bin, traceback.txt)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

from .model import TargetResult


def jsonable(value: Any) -> Any:
    """An input as JSON: bytes as base64 with a readable preview, dataclasses by field."""
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(value)).decode(), "preview": repr(bytes(value)[:300])}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__,
                **{f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def raw_bytes(value: Any) -> bytes:
    """The input's client bytes (its body, or the raw request) for input.bin."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    for name in ("raw", "body", "data"):
        if isinstance(getattr(value, name, None), bytes):
            return getattr(value, name)
    return repr(value).encode()


def folder_for(out: Path) -> Path:
    base = Path(out) / f"{time.strftime('%Y-%m-%d')}-fuzz"
    folder, n = base, 2
    while folder.exists():
        folder, n = base.with_name(f"{base.name}-{n}"), n + 1
    return folder


def table(results: list[TargetResult]) -> str:
    lines = ["| target | inputs tried | inputs/s | seconds | distinct outcomes | crashes (distinct) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        note = " (did not run)" if r.error else ""
        lines.append(f"| {r.name}{note} | {r.tried:,} | {r.rate:,.0f} | {r.seconds:.0f} | {len(r.outcomes)} "
                     f"| {r.crash_count} ({len(r.crashes)}) |")
    return "\n".join(lines) + "\n"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:60] or "crash"


def write(folder: Path, results: list[TargetResult], meta: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    crashes_dir = folder / "crashes"
    summary = {"meta": meta, "targets": []}
    for r in results:
        entry = {"target": r.name, "tried": r.tried, "seconds": round(r.seconds, 2), "per_second": round(r.rate, 1),
                 "outcomes": dict(sorted(r.outcomes.items(), key=lambda kv: -kv[1])), "crashes": r.crash_count,
                 "distinct_crashes": [], "error": r.error}
        for i, c in enumerate(r.crashes):
            d = crashes_dir / f"{r.name}-{i + 1}-{_slug(c.kind)}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "input.json").write_text(json.dumps({"target": r.name, "input": jsonable(c.input)}, indent=1) + "\n")
            (d / "input.bin").write_bytes(raw_bytes(c.input))
            (d / "traceback.txt").write_text(f"{c.kind}\n{c.signature}\n\n{c.detail}\n")
            entry["distinct_crashes"].append({"signature": c.signature, "count": c.count,
                                              "folder": str(d.relative_to(folder))})
        summary["targets"].append(entry)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    readme = [f"# Fuzz run {meta.get('date', '')}", "",
              f"`{meta.get('command', 'aspen-bench fuzz')}` (hypothesis seed {meta.get('seed')}, "
              f"{meta.get('seconds_per_target', 0):.0f} s per target; corpus of {meta.get('corpus_requests', 0)} "
              "requests captured from git clients).", "", table(results)]
    for r in results:
        if r.crashes:
            readme.append(f"Crashes in {r.name}:")
            readme += [f"- {c.signature} ×{c.count}" for c in r.crashes]
            readme.append("")
        if r.error:
            readme += [f"{r.name} did not run: {r.error.splitlines()[0]}", ""]
    (folder / "README.md").write_text("\n".join(readme))
    return folder

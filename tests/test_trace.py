"""The request trace's closed vocabulary (aspen_cgi/model/trace.py): a key
outside FIELDS is refused however it is written, and every key of FIELDS is
written or read somewhere in the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from aspen_cgi.model.trace import FIELDS, Trace

PACKAGE = Path(__file__).resolve().parent.parent / "aspen_cgi"


def test_a_key_outside_the_vocabulary_is_refused_however_written():
    t = Trace(repo="/r.git")
    t["plan"] = "planned"
    t.update(why="done", objects=3)
    t.setdefault("cache", "cold")
    assert dict(t) == {"repo": "/r.git", "plan": "planned", "why": "done", "objects": 3, "cache": "cold"}
    for write in (lambda: t.__setitem__("plna", 1), lambda: t.update(plna=1), lambda: t.update({"plna": 1}),
                  lambda: t.setdefault("plna", 1), lambda: Trace(plna=1)):
        with pytest.raises(KeyError, match="plna"):
            write()
    assert "plna" not in t


def test_every_field_is_used_by_the_code():
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "trace.py")
    unused = [k for k in FIELDS if f'"{k}"' not in text and f"{k}=" not in text and f"'{k}'" not in text]
    assert unused == []

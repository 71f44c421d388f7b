"""The hash chain over the ref store's versions (model/chain.py,
refstore/chaining.py): every version pushed through Aspen is chained to
the one before; `aspen log --json` shows the hashes; `aspen verify --chain`
names the first link a change to the store broke; `aspen log --export`
writes what docs/ref-store.md's procedure checks with Python alone; a store
made before the chain starts it at the next version, marked."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from aspen_cgi.model import chain

from . import harness as h
from .cgiserver import cgi_server_factory  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def _db(repo: Path) -> Path:
    return repo / "aspen" / "aspen.sqlite3"


@pytest.fixture
def pushed(tmp_path, cgi_server_factory):
    """A repository imported by Aspen (version 1), then pushed to three times through aspen-cgi,
    main and a new branch each time (a version per ref, as git updates them one by one: 2..7)."""
    root = tmp_path / "root"
    root.mkdir()
    bare = h.make_history(root / "r.git", commits=3)
    server = cgi_server_factory(root, program="aspen", GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.receivepack",
                                GIT_CONFIG_VALUE_0="true")
    work = tmp_path / "w"
    h.git("clone", "-q", f"{server.url}/r.git", str(work))
    for i in range(3):
        h.git("-C", str(work), "commit", "-q", "--allow-empty", "-m", f"c{i}")
        h.git("-C", str(work), "push", "-q", "origin", "HEAD:refs/heads/main", f"HEAD:refs/heads/b{i}")
    return bare


def test_every_version_is_chained_to_the_one_before(pushed):
    vs = h.versions(pushed)
    assert [v["kind"] for v in vs] == ["import"] + ["push"] * 6
    assert vs[0]["chain"]["start"] is True and vs[0]["chain"]["prev"] == chain.START_PREV
    for before, v in zip(vs, vs[1:]):
        assert v["chain"]["start"] is False
        assert v["chain"]["prev"] == before["chain"]["hash"]
    assert len({v["chain"]["hash"] for v in vs}) == 7
    res = h.aspen_cli("verify", "--chain", str(pushed))
    assert res.returncode == 0 and b"chain intact: versions 1..7 (7); it starts at version 1" in res.stdout


@pytest.mark.aspen_store_unchecked(reason="the test breaks the chain on purpose")
@pytest.mark.parametrize("tamper, version", [
    ("UPDATE updates SET new = old WHERE version = 3", 3),                      # a push's update changed
    ("UPDATE versions SET who = 'mallory' WHERE id = 2", 2),                    # who pushed
    ("UPDATE versions SET at = at + 1 WHERE id = 4", 4),                        # when
    ("DELETE FROM updates WHERE version = 3 AND ref = 'refs/heads/b0'", 3),     # an update removed
    ("UPDATE chain SET prev = hash WHERE version = 3", 3),                      # the link itself
    ("DELETE FROM chain WHERE version = 2", 3),                                 # a link removed
])
def test_verify_names_the_first_broken_link(pushed, tamper, version):
    h.store_write(pushed, tamper)
    res = h.aspen_cli("verify", "--chain", str(pushed))
    assert res.returncode == 1, res.stdout
    assert re.match(rf"chain broken at version {version}: ", res.stdout.decode()), res.stdout
    full = h.aspen_cli("verify", "-q", str(pushed))
    assert full.returncode == 1 and f"hash chain broken at version {version}".encode() in full.stdout


def _procedure() -> str:
    """The auditor's procedure, as docs/ref-store.md gives it."""
    doc = (ROOT / "docs" / "ref-store.md").read_text()
    m = re.search(r"<!-- auditor -->\n```python\n(.*?)```", doc, re.S)
    assert m, "docs/ref-store.md lost its auditor's procedure"
    return m.group(1)


def test_the_export_verifies_without_aspen(pushed, tmp_path):
    export = tmp_path / "chain.jsonl"
    res = h.aspen_cli("log", "--export", str(export), str(pushed))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in export.read_text().splitlines()]
    assert [x["version"] for x in lines] == [1, 2, 3, 4, 5, 6, 7]
    script = tmp_path / "audit.py"
    script.write_text(_procedure())
    ok = subprocess.run([sys.executable, "-I", "-S", str(script), str(export)], capture_output=True, text=True,
                        cwd=tmp_path, timeout=60)
    assert ok.returncode == 0 and "ok: versions 1..7" in ok.stdout, (ok.stdout, ok.stderr)
    lines[2]["text"] = lines[2]["text"].replace("refs/heads/b0", "refs/heads/bX")
    export.write_text("".join(json.dumps(x) + "\n" for x in lines))
    bad = subprocess.run([sys.executable, "-I", "-S", str(script), str(export)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert bad.returncode == 1 and "version 3" in bad.stdout, (bad.stdout, bad.stderr)


@pytest.mark.sqlite_store("a SQLite file as schema 6 left it")
def test_a_store_from_before_the_chain_starts_it_at_the_next_version(tmp_path, cgi_server_factory):
    root = tmp_path / "root"
    root.mkdir()
    bare = h.make_history(root / "r.git", commits=2)
    assert h.aspen_cli("log", str(bare)).returncode == 0           # imported: version 1
    with sqlite3.connect(_db(bare)) as c:                          # as schema 6 left it
        c.execute("DROP TABLE chain")
        c.execute("DELETE FROM state WHERE key = 'chain_from'")
        c.execute("PRAGMA user_version=6")
    server = cgi_server_factory(root, program="aspen", GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.receivepack",
                                GIT_CONFIG_VALUE_0="true")
    work = tmp_path / "w"
    h.git("clone", "-q", f"{server.url}/r.git", str(work))
    for i in range(2):
        h.git("-C", str(work), "commit", "-q", "--allow-empty", "-m", f"c{i}")
        h.git("-C", str(work), "push", "-q", "origin", "HEAD:refs/heads/main")
    vs = h.versions(bare)
    assert [v["id"] for v in vs] == [1, 2, 3]
    assert vs[0]["chain"] is None                                  # before the chain: not covered
    assert vs[1]["chain"]["start"] is True and vs[1]["chain"]["prev"] == chain.START_PREV
    assert vs[2]["chain"]["prev"] == vs[1]["chain"]["hash"]
    res = h.aspen_cli("verify", "--chain", str(bare))
    assert res.returncode == 0 and b"versions 2..3 (2); it starts at version 2" in res.stdout


def test_canonical_text_escapes_what_would_forge_a_line():
    a = chain.text(2, chain.START_PREV, "push", "eve\nupdate refs/heads/x 0 1 1", 1.5, None, [], None)
    b = chain.text(2, chain.START_PREV, "push", "eve", 1.5, None, [("refs/heads/x", "0", "1", True)], None)
    assert a != b and chain.digest(a) != chain.digest(b)
    assert chain.text(2, chain.START_PREV, "push", "-", 1.5, None, [], None) != \
        chain.text(2, chain.START_PREV, "push", None, 1.5, None, [], None)

"""Span packs (packs/spanpack.py): a plan of several small thin extents is
answered by one pack over the same objects when that is smaller, built once
and kept for the next client in the same state.

- a client three pushes behind gets a correct answer whichever wins (its
  access line says span=built or span=spliced), and a second client in
  the same state gets the recorded choice (span=kept or span=spliced again)
  with no new pack made;
- the span pack itself, thin against the commits the plan proved, completes
  a client that holds them, and holds no object that client has."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from aspen_cgi.packs import spanpack
from aspen_cgi.refstore.store import RefStore

from . import harness as h
from . import pushkit as pk


def _spans(server) -> list[str]:
    return re.findall(r"service=upload-pack method=POST .*", server.log_text())


def _settled(repo: Path) -> RefStore:
    import time
    store = RefStore.open(str(repo), dict(os.environ), create=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        store.sync()
        if store.all_packs_built():
            return store
        time.sleep(0.1)
    raise AssertionError("version packs not built")


def test_a_plan_of_small_extents_takes_the_smaller_of_splice_and_span(root, server_factory, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_CACHE="off")     # the twin asks again
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    behind = tmp_path / "behind"
    h.git("clone", "-q", "--mirror", server.url + "/repo.git", str(behind))
    twin = tmp_path / "twin"
    shutil.copytree(behind, twin)
    text = "".join(f"line {j} of a file that grows\n" for j in range(400))
    for i in range(3):
        (work / f"copy{i}.txt").write_text(text + f"copy {i}\n")
        pk.commit(work, f"copy {i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store = _settled(repo)
    packs_before = {n for n in os.listdir(store.packs_dir) if n.endswith(".pack")}
    h.git("-c", "protocol.version=2", "fetch", "-q", "origin", cwd=str(behind))
    first = _spans(server)[-1]
    assert "plan=planned" in first, first
    chosen = re.search(r"span=(\w+)", first)
    assert chosen and chosen.group(1) in ("built", "spliced"), first
    h.fsck_strict(str(behind))
    assert h.refs_of(str(behind)) == h.refs_of(str(repo))
    made = {n for n in os.listdir(store.packs_dir) if n.endswith(".pack")} - packs_before
    assert len(made) == (1 if chosen.group(1) == "built" else 0)
    h.git("-c", "protocol.version=2", "fetch", "-q", "origin", cwd=str(twin))
    second = _spans(server)[-1]
    assert f"span={'kept' if chosen.group(1) == 'built' else 'spliced'}" in second, second
    assert {n for n in os.listdir(store.packs_dir) if n.endswith(".pack")} - packs_before == made
    h.fsck_strict(str(twin))
    assert h.refs_of(str(twin)) == h.refs_of(str(repo))


def test_a_span_pack_completes_a_client_holding_the_proved_commits(tmp_path):
    repo = tmp_path / "repo.git"
    h.git("init", "-q", "--bare", str(repo))
    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    text = "".join(f"line {j}\n" for j in range(300))
    (work / "f.txt").write_text(text)
    base = pk.commit(work, "base")
    h.git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=str(work))
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--bare", str(repo), str(client))
    for i in range(3):
        (work / "f.txt").write_text(text + f"{i}\n" * (i + 1))
        pk.commit(work, f"c{i}")
    tip = h.out("rev-parse", "HEAD", cwd=str(work))
    h.git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=str(work))
    out = tmp_path / "packs"
    out.mkdir()
    built = spanpack.make(str(repo), dict(os.environ), str(out), [tip], [base], 1 << 20)
    listed = h.out("rev-list", "--objects", tip, f"^{base}", cwd=str(repo)).splitlines()
    assert built is not None and built.objects == len(listed)
    h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=Path(built.pack).read_bytes())
    h.git("update-ref", "refs/heads/main", tip, cwd=str(client))
    h.fsck_strict(str(client))
    assert spanpack.make(str(repo), dict(os.environ), str(out), ["0" * 40], [base], 1 << 20) is None
    kept = set(os.listdir(out))                                  # no smaller than the splice: neither indexed nor kept
    assert spanpack.make(str(repo), dict(os.environ), str(out), [tip], [base], built.size) is None
    assert set(os.listdir(out)) == kept
    spanpack.record(str(out), "k", built.name)
    assert spanpack.recorded(str(out), "k") == built.name
    os.unlink(built.idx)
    assert spanpack.recorded(str(out), "k") is None              # its pack swept: made again

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
from aspen_cgi.packs.splice import Extent, plan_splice
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk


def _spans(server) -> list[str]:
    return re.findall(r"service=upload-pack method=POST .*", server.log_text())


def _settled(repo: Path) -> RefStore:
    import time
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        store.sync()
        if store.all_packs_built():
            return store
        time.sleep(0.1)
    raise AssertionError("version packs not built")


def _sizes(store: RefStore, versions: list[int], held: str, scratch: Path) -> tuple[str, int, int]:
    """(the plan's span key, its splice's bytes, its span pack's bytes) for a
    client holding HELD that needs VERSIONS: the splice of their version
    packs, and the span pack built again into SCRATCH as a request builds it."""
    names = [store.version_pack(v)[0][0] for v in versions]
    spliced = plan_splice(Extent(os.path.join(store.packs_dir, f"pack-{n}.pack"), thin=True) for n in names)
    scratch.mkdir()
    values = [x for v in versions for x in store.version_values(v)]
    span = spanpack.make(Repository.of(store.gitdir, dict(os.environ)), str(scratch), values, [held], 1 << 40)
    assert span is not None
    return spanpack.key(names), spliced.size, span.size


def test_a_plan_of_small_extents_takes_the_smaller_of_splice_and_span(root, server_factory, tmp_path):
    """The first client behind by three pushes gets the smaller of the splice and
    the span pack (their bytes compared here), the choice is recorded under the
    plan's key, and the second gets it again without a new pack. No segment
    pack is built meanwhile (ASPEN_COMPACT_QUIET_MS): the plan is the three
    version packs."""
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_CACHE="off",      # the twin asks again
                            ASPEN_COMPACT_QUIET_MS="600000")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    behind = tmp_path / "behind"
    h.git("clone", "-q", "--mirror", server.url + "/repo.git", str(behind))
    held = h.refs_of(str(behind))["refs/heads/main"]
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
    key, splice_bytes, span_bytes = _sizes(store, list(range(store.latest() - 2, store.latest() + 1)), held,
                                           tmp_path / "span")
    print(f"SPAN splice {splice_bytes} bytes, span {span_bytes} bytes: {chosen.group(1)}")
    if chosen.group(1) == "built":
        kept = os.path.join(store.packs_dir, next(iter(made)))
        assert os.path.getsize(kept) == span_bytes, "the kept span pack is not the one its plan makes"
        assert spanpack.recorded(store.packs_dir, key) == os.path.basename(kept)[len("pack-"):-len(".pack")]
        assert span_bytes < splice_bytes, f"the span pack ({span_bytes} bytes) sent over a smaller splice"
    else:
        assert spanpack.recorded(store.packs_dir, key) == spanpack.SPLICE
        assert splice_bytes <= span_bytes, f"the splice ({splice_bytes} bytes) sent over a smaller span pack"
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
    built = spanpack.make(Repository.of(str(repo), dict(os.environ)), str(out), [tip], [base], 1 << 20)
    listed = h.out("rev-list", "--objects", tip, f"^{base}", cwd=str(repo)).splitlines()
    assert built is not None and built.objects == len(listed)
    h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=Path(built.pack).read_bytes())
    h.git("update-ref", "refs/heads/main", tip, cwd=str(client))
    h.fsck_strict(str(client))
    assert spanpack.make(Repository.of(str(repo), dict(os.environ)), str(out), ["0" * 40], [base], 1 << 20) is None
    kept = set(os.listdir(out))                                  # no smaller than the splice: neither indexed nor kept
    assert spanpack.make(Repository.of(str(repo), dict(os.environ)), str(out), [tip], [base], built.size) is None
    assert set(os.listdir(out)) == kept
    spanpack.record(str(out), "k", built.name)
    assert spanpack.recorded(str(out), "k") == built.name
    os.unlink(built.idx)
    assert spanpack.recorded(str(out), "k") is None              # its pack swept: made again

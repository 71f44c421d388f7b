"""Real git clients fetching from Aspen (gunicorn on loopback), each scenario
run the same way against stock git-http-backend (tests/cgiserver.py) and
compared: refs, HEAD and the set of objects the client ends up with
(reachable or not). Every scenario runs with the client's
transfer.fsckObjects false and true, against Aspen with version packs off
and on, and the client repository must pass `git fsck --strict`."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest

from . import harness as h
from .cgiserver import CgiServer

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- server side

def dated(n: int) -> dict:
    stamp = f"{1600000000 + n * 86400} +0000"
    return {"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}


def commit(work: str, n: int, msg: str, path: str = "file.txt") -> str:
    p = Path(work) / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{msg}\n" + "".join(f"line {j} {n}\n" for j in range(30 + n)))
    h.git("add", "-A", cwd=work)
    h.git("commit", "-q", "-m", msg, cwd=work, env=dated(n))
    return h.out("rev-parse", "HEAD", cwd=work)


def build_repo(bare: Path) -> Path:
    """main: 8 dated commits (one a day), a topic branch merged in, `old` at
    commit 2; tags: annotated v1 (commit 2), lightweight light (commit 5),
    tag-of-tag tt -> v1, and `orphan`, an annotated tag on a commit no
    branch reaches; refs/hidden/secret on another unreachable commit."""
    work = str(bare) + ".work"
    h.git("init", "-q", "-b", "main", work)
    for i in range(8):
        commit(work, i, f"commit {i}", f"src/d{i % 3}/f{i}.txt")
        if i == 2:
            h.git("branch", "old", cwd=work)
            h.git("tag", "-a", "-m", "v1", "v1", cwd=work, env=dated(i))
        if i == 5:
            h.git("tag", "light", cwd=work)
    h.git("tag", "-a", "-m", "tag of a tag", "tt", "v1", cwd=work, env=dated(9))
    h.git("checkout", "-q", "-b", "topic", "HEAD~3", cwd=work)
    commit(work, 10, "topic work", "topic.txt")
    h.git("checkout", "-q", "main", cwd=work)
    h.git("merge", "-q", "--no-ff", "-m", "merge topic", "topic", cwd=work, env=dated(11))
    h.git("checkout", "-q", "--orphan", "side", cwd=work)
    commit(work, 12, "orphan history", "side.txt")
    h.git("tag", "-a", "-m", "orphan", "orphan", cwd=work, env=dated(12))
    h.git("checkout", "-q", "--orphan", "secret", cwd=work)
    commit(work, 13, "secret history", "secret.txt")
    h.git("update-ref", "refs/hidden/secret", "HEAD", cwd=work)
    h.git("checkout", "-q", "--orphan", "dangling", cwd=work)
    dangling = commit(work, 14, "dangling", "dangling.txt")
    h.git("checkout", "-q", "main", cwd=work)
    h.git("branch", "-D", "side", "secret", "dangling", cwd=work)
    h.git("clone", "-q", "--bare", "--no-local", work, str(bare))
    h.git("remote", "remove", "origin", cwd=str(bare))
    h.git("fetch", "-q", work, "refs/hidden/secret:refs/hidden/secret", cwd=str(bare))
    h.git("fetch", "-q", work, f"{dangling}:refs/tmp", cwd=str(bare))
    h.git("update-ref", "-d", "refs/tmp", cwd=str(bare))
    (bare / "dangling").write_text(dangling + "\n")
    shutil.rmtree(work)
    return bare


def clone_repo(src: Path, dest: Path, **config: str) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    for k, v in config.items():
        h.git("config", k, v, cwd=str(dest))
    return dest


def many_refs(bare: Path, n: int) -> Path:
    """A chain of N commits with a branch on each: a mirror clone wants N
    objects, a request over 64 KiB that the client sends chunked after a probe."""
    h.git("init", "-q", "--bare", "-b", "main", str(bare))
    lines = []
    for i in range(n):
        msg = f"c{i}\n"
        lines.append(f"commit refs/heads/b{i:05d}\nmark :{i + 1}\n"
                     f"committer T <t@x> {1600000000 + i} +0000\ndata {len(msg)}\n{msg}")
        if i:
            lines.append(f"from :{i}\n")
        lines.append(f"M 644 inline f.txt\ndata {len(str(i)) + 1}\n{i}\n\n")
    lines.append(f"reset refs/heads/main\nfrom :{n}\n\n")
    h.git("fast-import", "--quiet", cwd=str(bare), input="".join(lines).encode())
    return bare


@dataclass
class Servers:
    root: Path
    urls: dict[str, str] = field(default_factory=dict)     # "aspen" / "stock" -> base URL

    def repo(self, name: str) -> Path:
        return self.root / name


@pytest.fixture(scope="module", params=["off", "auto"], ids=["packs-off", "packs-on"])
def servers(tmp_path_factory, request):
    """Aspen (gunicorn) and stock (CGI) over one ROOT holding repositories
    that differ in configuration; Aspen once with version packs off (every
    fetch is git's) and once on (a fetch starts the builder, waits for it,
    and is planned from stored packs where the planner proves it can be)."""
    root = tmp_path_factory.mktemp("fetch") / "root"
    root.mkdir()
    base = build_repo(root / "repo.git")
    clone_repo(base, root / "filter.git", **{"uploadpack.allowFilter": "true"})
    # v0 lazy fetches want blobs by id: only allowAnySHA1InWant lets them through (v2 allows any object)
    clone_repo(base, root / "filterany.git", **{"uploadpack.allowFilter": "true",
                                                "uploadpack.allowAnySHA1InWant": "true"})
    clone_repo(base, root / "hidden.git", **{"uploadpack.hideRefs": "refs/hidden"})
    clone_repo(base, root / "tip.git", **{"uploadpack.hideRefs": "refs/hidden",
                                          "uploadpack.allowTipSHA1InWant": "true"})
    clone_repo(base, root / "reachable.git", **{"uploadpack.allowReachableSHA1InWant": "true"})
    clone_repo(base, root / "any.git", **{"uploadpack.allowAnySHA1InWant": "true"})
    clone_repo(base, root / "refinwant.git", **{"uploadpack.allowRefInWant": "true"})
    detached = clone_repo(base, root / "detached.git")
    (detached / "HEAD").write_text(h.out("rev-parse", "main~2", cwd=str(detached)) + "\n")
    h.git("init", "-q", "--bare", "-b", "trunk", str(root / "empty.git"))
    h.git("clone", "-q", "--bare", "--depth", "2", "--no-single-branch", f"file://{base}", str(root / "shallow.git"))
    many_refs(root / "manyrefs.git", 1500)
    ns = clone_repo(base, root / "ns.git")
    for ref in ("refs/heads/main", "refs/tags/v1"):
        h.git("update-ref", f"refs/namespaces/team/{ref}", ref, cwd=str(ns))
    h.git("update-ref", "refs/namespaces/team/refs/heads/feature", "topic", cwd=str(ns))
    h.git("symbolic-ref", "refs/namespaces/team/HEAD", "refs/namespaces/team/refs/heads/main", cwd=str(ns))
    s = Servers(root)
    started = []
    packs = {"ASPEN_VERSION_PACKS": request.param, "ASPEN_ACCESS_LOG": "1"}
    aspen = h.Server(root, packs).start()
    stock = CgiServer(root, {}, "stock").start()
    aspen_ns = h.Server(root, {"GIT_NAMESPACE": "team", **packs}).start()
    stock_ns = CgiServer(root, {"GIT_NAMESPACE": "team"}, "stock").start()
    started += [aspen, stock, aspen_ns, stock_ns]
    s.urls = {"aspen": aspen.url, "stock": stock.url}
    s.ns_urls = {"aspen": aspen_ns.url, "stock": stock_ns.url}
    s.aspen = aspen
    yield s
    for srv in started:
        srv.stop()


# ---------------------------------------------------------------- client side

@dataclass
class Client:
    base: str           # server base URL
    dest: Path          # the client repository
    protocol: str
    fsck: str
    root: Path          # the servers' project root (read-only use)

    def url(self, repo: str = "repo.git") -> str:
        return f"{self.base}/{repo}"

    def git(self, *args, cwd: Optional[Path] = None, check: bool = True):
        return h.git("-c", f"protocol.version={self.protocol}", "-c", f"transfer.fsckObjects={self.fsck}",
                     "-c", "advice.detachedHead=false", *args,
                     cwd=str(cwd or self.dest), check=check)

    def clone(self, *args, repo: str = "repo.git"):
        return self.git("clone", "-q", *args, self.url(repo), str(self.dest), cwd=self.dest.parent)

    def out(self, *args) -> str:
        return self.git(*args).stdout.decode().strip()

    def server(self, repo: str = "repo.git") -> str:
        return str(self.root / repo)


def objects(repo: Path) -> set[str]:
    text = h.out("cat-file", "--batch-all-objects", "--batch-check", cwd=str(repo))
    return set(text.splitlines())


def state(repo: Path) -> dict:
    head = h.git("symbolic-ref", "-q", "HEAD", cwd=str(repo), check=False).stdout.decode().strip()
    return {"refs": h.refs_of(str(repo)), "head": head or h.out("rev-parse", "HEAD", cwd=str(repo)),
            "objects": objects(repo), "shallow": (repo / "shallow").read_text().split()
            if (repo / "shallow").exists() else []}


def git_dir(dest: Path) -> Path:
    return dest / ".git" if (dest / ".git").is_dir() else dest


def run_differential(servers: Servers, tmp_path: Path, protocol: str, fsck: str,
                     steps: list[Callable[[Client], object]], base_urls: Optional[dict] = None) -> dict[str, dict]:
    """Run STEPS as one client against Aspen and as another against stock;
    both must pass fsck --strict and end with the same refs, HEAD and objects."""
    results = {}
    clients = {}
    for name, base in (base_urls or servers.urls).items():
        clients[name] = Client(base, tmp_path / name / "client", protocol, fsck, servers.root)
        clients[name].dest.parent.mkdir(parents=True)
    for step in steps:              # step by step, so a server change lands between the same steps
        for c in clients.values():
            step(c)
    for name, c in clients.items():
        gd = git_dir(c.dest)
        h.fsck_strict(str(gd))
        results[name] = state(gd)
    assert results["aspen"] == results["stock"]
    return results["aspen"]


PROTOCOLS = pytest.mark.parametrize("protocol", ["0", "2"])
FSCK = pytest.mark.parametrize("fsck", ["false", "true"])


def server_refs(servers: Servers, repo: str = "repo.git", prefix: str = "") -> dict[str, str]:
    return {k: v for k, v in h.refs_of(str(servers.repo(repo))).items() if k.startswith(prefix)}


# ---------------------------------------------------------------- scenarios

@pytest.mark.parametrize("protocol", ["0", "1", "2"])
@FSCK
def test_clone(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone()])
    heads = server_refs(servers, prefix="refs/heads/")
    assert {k.replace("refs/remotes/origin/", "refs/heads/"): v for k, v in st["refs"].items()
            if k.startswith("refs/remotes/origin/") and k != "refs/remotes/origin/HEAD"} == heads
    assert {k: v for k, v in st["refs"].items() if k.startswith("refs/tags/")} == \
        server_refs(servers, prefix="refs/tags/")
    assert st["head"] == "refs/heads/main"


@pytest.mark.parametrize("protocol", ["0", "1", "2"])
@FSCK
def test_mirror_clone_has_all_refs(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone("--mirror")])
    assert st["refs"] == h.refs_of(str(servers.repo("repo.git")))
    assert "refs/hidden/secret" in st["refs"]


@PROTOCOLS
@FSCK
def test_incremental_fetch_after_new_commits(servers, tmp_path, protocol, fsck):
    repo = clone_repo(servers.repo("repo.git"), servers.root / f"incr-{protocol}-{fsck}.git")
    work = tmp_path / "work"

    def push_more(c: Client):
        if not work.exists():
            h.git("clone", "-q", str(repo), str(work))
            commit(str(work), 20, "more 1", "more.txt")
            commit(str(work), 21, "more 2", "src/d0/f0.txt")
            h.git("tag", "-a", "-m", "v2", "v2", cwd=str(work))
            h.git("push", "-q", "origin", "main", "v2", "main:refs/heads/new", cwd=str(work))

    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone("--bare", repo=repo.name),
        lambda c: c.git("config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*"),
        push_more,
        lambda c: c.git("fetch", "-q", "origin"),
        lambda c: c.git("fetch", "-q", "origin", "--tags"),
    ])
    assert st["refs"]["refs/remotes/origin/main"] == h.out("rev-parse", "main", cwd=str(repo))
    assert st["refs"]["refs/remotes/origin/new"] == st["refs"]["refs/remotes/origin/main"]
    assert st["refs"]["refs/tags/v2"] == h.out("rev-parse", "v2", cwd=str(repo))


@PROTOCOLS
@FSCK
def test_shallow_clone_depth_1(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone("--depth", "1")])
    assert st["shallow"] == [h.out("rev-parse", "main", cwd=str(servers.repo("repo.git")))]
    assert h.out("rev-list", "--count", "HEAD", cwd=str(tmp_path / "aspen" / "client")) == "1"


@PROTOCOLS
@FSCK
def test_deepen(servers, tmp_path, protocol, fsck):
    run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone("--depth", "1", "--single-branch"),
        lambda c: c.git("fetch", "-q", "--deepen", "2"),
    ])
    # merge commit + its two parents, then one more on main's first parent line
    assert int(h.out("rev-list", "--count", "HEAD", cwd=str(tmp_path / "aspen" / "client"))) == 5


@PROTOCOLS
@FSCK
def test_shallow_since(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone("--shallow-since", "2020-09-18 00:00:00 +0000", "--single-branch"),
    ])
    dates = h.out("log", "--format=%ct", "HEAD", cwd=str(tmp_path / "aspen" / "client")).split()
    assert st["shallow"] and all(int(d) >= 1600000000 + 5 * 86400 for d in dates)


@PROTOCOLS
@FSCK
def test_shallow_exclude(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone("--shallow-exclude", "old", "--single-branch"),
    ])
    client = str(tmp_path / "aspen" / "client")
    old = h.out("rev-parse", "old", cwd=str(servers.repo("repo.git")))
    assert st["shallow"] and old not in h.out("rev-list", "HEAD", cwd=client).split()


@PROTOCOLS
@FSCK
def test_unshallow(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone("--depth", "1"),
        lambda c: c.git("fetch", "-q", "--unshallow"),
    ])
    assert st["shallow"] == []
    assert h.out("rev-list", "--count", "main", cwd=str(tmp_path / "aspen" / "client")) == \
        h.out("rev-list", "--count", "main", cwd=str(servers.repo("repo.git")))


def count_type(repo: Path, otype: str) -> int:
    return sum(1 for line in objects(repo) if line.split()[1] == otype)


@PROTOCOLS
@FSCK
@pytest.mark.parametrize("spec", ["blob:none", "tree:0"])
def test_partial_clone_then_lazy_checkout(servers, tmp_path, protocol, fsck, spec):
    before = {}

    def note(c: Client):
        before[c.base] = (count_type(git_dir(c.dest), "blob"), count_type(git_dir(c.dest), "tree"))

    run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone("--filter", spec, "--no-checkout", repo="filter.git" if protocol == "2" else "filterany.git"),
        note,
        lambda c: c.git("checkout", "-q", "main"),
        lambda c: c.git("checkout", "-q", "topic"),
    ])
    client = tmp_path / "aspen" / "client"
    assert before[servers.urls["aspen"]][0] == 0
    if spec == "tree:0":
        assert before[servers.urls["aspen"]][1] == 0
    assert (client / "topic.txt").exists() and (client / "src" / "d1" / "f4.txt").exists()
    assert count_type(client / ".git", "blob") > 0
    assert h.out("config", "remote.origin.promisor", cwd=str(client)) == "true"


@PROTOCOLS
@FSCK
def test_filter_refused_without_allow_filter(servers, tmp_path, protocol, fsck):
    """The server does not allow filters: the client warns and gets a full clone."""
    run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone("--filter", "blob:none")])
    assert count_type(tmp_path / "aspen" / "client" / ".git", "blob") == \
        count_type(tmp_path / "stock" / "client" / ".git", "blob") > 0


@PROTOCOLS
@FSCK
def test_no_tags(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone("--no-tags")])
    assert not any(k.startswith("refs/tags/") for k in st["refs"])


@PROTOCOLS
@FSCK
def test_include_tag_follows_tags_into_fetched_history(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.git("init", "-q", "--bare", str(c.dest), cwd=c.dest.parent),
        lambda c: c.git("fetch", "-q", c.url(), "refs/heads/old:refs/heads/old"),
    ])
    tags = {k for k in st["refs"] if k.startswith("refs/tags/")}
    assert "refs/tags/v1" in tags and "refs/tags/light" not in tags and "refs/tags/orphan" not in tags


@PROTOCOLS
@FSCK
def test_tag_of_tag_fetch(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.git("init", "-q", "--bare", str(c.dest), cwd=c.dest.parent),
        lambda c: c.git("fetch", "-q", "--no-tags", c.url(), "refs/tags/tt:refs/tags/tt", "refs/tags/orphan:refs/tags/orphan"),
    ])
    client = str(tmp_path / "aspen" / "client")
    server = str(servers.repo("repo.git"))
    assert st["refs"]["refs/tags/tt"] == h.out("rev-parse", "tt", cwd=server)
    assert h.out("rev-parse", "tt^{}", cwd=client) == h.out("rev-parse", "v1^{commit}", cwd=server)
    assert h.out("cat-file", "-t", "tt^{tag}", cwd=client) == "tag"


@PROTOCOLS
@FSCK
def test_hidden_refs_not_advertised_and_not_fetchable(servers, tmp_path, protocol, fsck):
    secret = h.out("rev-parse", "refs/hidden/secret", cwd=str(servers.repo("hidden.git")))
    outcome = {}

    def try_fetch(c: Client):
        listed = c.git("ls-remote", c.url("hidden.git"), cwd=c.dest.parent).stdout.decode()
        assert "refs/hidden" not in listed and "refs/heads/main" in listed
        scratch = c.dest.parent / (c.dest.name + "-scratch")     # the compared clone stays as it was
        c.git("init", "-q", "--bare", str(scratch), cwd=c.dest.parent)
        p = c.git("fetch", "-q", c.url("hidden.git"), secret, cwd=scratch, check=False)
        outcome[c.base] = (p.returncode, p.stderr.decode())

    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone("--mirror", repo="hidden.git"),
        try_fetch,
    ])
    assert "refs/hidden/secret" not in st["refs"]
    (arc, aerr), (src, _) = outcome[servers.urls["aspen"]], outcome[servers.urls["stock"]]
    if protocol == "0":
        # the v0 client refuses by itself (no allow-*-sha1-in-want advertised);
        # the server's own refusal is in test_fetch_badinput.py
        assert arc != 0 and src != 0 and "unadvertised object" in aerr
    else:
        # stock's v2 upload-pack serves any existing object; Aspen refuses a hidden one (test_security.py)
        assert src == 0 and arc != 0 and "not our ref" in aerr


@PROTOCOLS
@FSCK
def test_allow_tip_sha1_in_want_fetches_hidden_tip(servers, tmp_path, protocol, fsck):
    secret = h.out("rev-parse", "refs/hidden/secret", cwd=str(servers.repo("tip.git")))
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.git("init", "-q", "--bare", str(c.dest), cwd=c.dest.parent),
        lambda c: c.git("fetch", "-q", c.url("tip.git"), f"{secret}:refs/heads/got"),
    ])
    assert st["refs"] == {"refs/heads/got": secret}


@PROTOCOLS
@FSCK
@pytest.mark.parametrize("repo", ["repo.git", "reachable.git"])
def test_fetch_reachable_commit_by_id(servers, tmp_path, protocol, fsck, repo):
    """Over stateless HTTP any want reachable from a ref is allowed (check_non_tip)."""
    oid = h.out("rev-parse", "main~3", cwd=str(servers.repo(repo)))
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.git("init", "-q", "--bare", str(c.dest), cwd=c.dest.parent),
        lambda c: c.git("fetch", "-q", c.url(repo), f"{oid}:refs/heads/got"),
    ])
    assert st["refs"]["refs/heads/got"] == oid
    assert "refs/tags/v1" in st["refs"]            # include-tag: v1 points into the fetched history


@PROTOCOLS
@FSCK
@pytest.mark.parametrize("repo,ok", [("repo.git", False), ("reachable.git", False), ("tip.git", False),
                                     ("any.git", True)])
def test_fetch_unreachable_object_by_id(servers, tmp_path, protocol, fsck, repo, ok):
    oid = (servers.repo(repo) / "dangling").read_text().strip()
    outcome = {}
    # stock's v2 serves any object; with hidden refs Aspen holds v2 to v0's rule (test_security.py)
    diverges = protocol == "2" and repo == "tip.git"

    def fetch(c: Client):
        scratch = c.dest.parent / (c.dest.name + "-scratch") if diverges else None
        if scratch is not None:
            c.git("init", "-q", "--bare", str(scratch), cwd=c.dest.parent)
        p = c.git("fetch", "-q", c.url(repo), f"{oid}:refs/heads/got", cwd=scratch, check=False)
        outcome[c.base] = p.returncode == 0, p.stderr.decode()

    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.git("init", "-q", "--bare", str(c.dest), cwd=c.dest.parent),
        fetch,
    ])
    if diverges:
        aspen, stock = outcome[servers.urls["aspen"]], outcome[servers.urls["stock"]]
        assert stock[0] and not aspen[0] and "not our ref" in aspen[1]
        return
    ok = ok or protocol == "2"     # v2 upload-pack serves any existing object, as stock does
    assert outcome[servers.urls["aspen"]][0] == outcome[servers.urls["stock"]][0] == ok
    assert st["refs"] == ({"refs/heads/got": oid} if ok else {})
    if not ok:
        err = outcome[servers.urls["aspen"]][1]
        assert "not our ref" in err or "unadvertised object" in err


@PROTOCOLS
@FSCK
def test_namespace_only_its_refs_visible(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone("--mirror", repo="ns.git")],
                          base_urls=servers.ns_urls)
    server = str(servers.repo("ns.git"))
    assert st["refs"] == {
        "refs/heads/main": h.out("rev-parse", "main", cwd=server),
        "refs/heads/feature": h.out("rev-parse", "topic", cwd=server),
        "refs/tags/v1": h.out("rev-parse", "v1", cwd=server),
    }
    assert st["head"] == "refs/heads/main"


@PROTOCOLS
@FSCK
def test_namespace_clone_and_fetch(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.clone(repo="ns.git"),
        lambda c: c.git("fetch", "-q", "origin", "feature"),
    ], base_urls=servers.ns_urls)
    assert set(st["refs"]) == {"refs/heads/main", "refs/remotes/origin/HEAD", "refs/remotes/origin/main",
                               "refs/remotes/origin/feature", "refs/tags/v1"}


@PROTOCOLS
@FSCK
def test_empty_repository_clone(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone(repo="empty.git")])
    assert st["refs"] == {} and st["objects"] == set()
    if protocol == "2":
        assert st["head"] == "refs/heads/trunk"     # ls-refs unborn tells the client


@PROTOCOLS
@FSCK
def test_detached_head_clone(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone(repo="detached.git")])
    assert st["head"] == h.out("rev-parse", "main~2", cwd=str(servers.repo("detached.git")))


@PROTOCOLS
def test_large_negotiation_with_many_haves(servers, tmp_path, protocol):
    """A client with many local commits unknown to the server: several
    stateless rounds (and gzip-encoded requests) until the server is ready."""
    def local_history(c: Client):
        c.clone("--single-branch", "--branch", "old")
        for i in range(120):
            h.git("commit", "-q", "--allow-empty", "-m", f"local {i}", cwd=str(c.dest), env=dated(100 + i))
    st = run_differential(servers, tmp_path, protocol, "true", [
        local_history,
        lambda c: c.git("fetch", "-q", "origin", "main:refs/remotes/origin/main"),
    ])
    assert st["refs"]["refs/remotes/origin/main"] == h.out("rev-parse", "main", cwd=str(servers.repo("repo.git")))


def test_aspen_log_has_no_traceback(servers):
    assert "Traceback" not in servers.aspen.log_text()


@PROTOCOLS
@FSCK
def test_clone_from_shallow_server_repository(servers, tmp_path, protocol, fsck):
    st = run_differential(servers, tmp_path, protocol, fsck, [lambda c: c.clone("--mirror", repo="shallow.git")])
    server = servers.repo("shallow.git")
    assert st["refs"] == h.refs_of(str(server))
    assert set((server / "shallow").read_text().split()) <= set(st["shallow"])


@PROTOCOLS
def test_mirror_clone_of_many_refs_sends_a_chunked_request(servers, tmp_path, protocol):
    """1500 wants (about 75 KB): over http.postBuffer, so the client probes
    with `0000` and then sends the request chunked."""
    st = run_differential(servers, tmp_path, protocol, "true", [
        lambda c: c.git("-c", "http.postBuffer=65536", "clone", "-q", "--mirror", c.url("manyrefs.git"),
                        str(c.dest), cwd=c.dest.parent),
    ])
    assert st["refs"] == h.refs_of(str(servers.repo("manyrefs.git")))
    assert len(st["refs"]) == 1501


@pytest.mark.parametrize("protocol", ["0", "2"])
def test_aspen_cgi_under_a_cgi_host_matches_stock(servers, tmp_path, protocol, cgi_server_factory):
    """aspen-cgi run as a CGI program (not WSGI) by tests/cgiserver.py: a
    mirror clone, a chunked many-wants clone, and a partial clone with a lazy
    checkout end the same as with stock."""
    aspen_cgi = cgi_server_factory(servers.root, "aspen")
    urls = {"aspen": aspen_cgi.url, "stock": servers.urls["stock"]}
    st = run_differential(servers, tmp_path / "mirror", protocol, "true",
                          [lambda c: c.clone("--mirror")], base_urls=urls)
    assert st["refs"] == h.refs_of(str(servers.repo("repo.git")))
    st = run_differential(servers, tmp_path / "many", protocol, "true", [
        lambda c: c.git("-c", "http.postBuffer=65536", "clone", "-q", "--mirror", c.url("manyrefs.git"),
                        str(c.dest), cwd=c.dest.parent)], base_urls=urls)
    assert len(st["refs"]) == 1501
    run_differential(servers, tmp_path / "partial", protocol, "true", [
        lambda c: c.clone("--filter", "blob:none", repo="filterany.git"),
    ], base_urls=urls)
    assert "Traceback" not in aspen_cgi.log_text()


def test_cgiserver_relays_status_headers_and_body(servers, cgi_server_factory):
    """tests/cgiserver.py itself: stock's and aspen-cgi's Status and headers reach the client."""
    aspen_cgi = cgi_server_factory(servers.root, "aspen")
    for base in (servers.urls["stock"], aspen_cgi.url):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/nope.git/info/refs?service=git-upload-pack", timeout=10)
        assert e.value.code == 404
        req = urllib.request.Request(f"{base}/repo.git/info/refs?service=git-upload-pack",
                                     headers={"Git-Protocol": "version=2"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"] == "application/x-git-upload-pack-advertisement"
            assert r.read().startswith(b"000eversion 2\n")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(f"{base}/repo.git/git-upload-pack", data=b"0000",
                                                          headers={"Content-Type": "text/plain"}), timeout=10)
        assert e.value.code == 415


@PROTOCOLS
@FSCK
def test_fetch_with_ref_in_want(servers, tmp_path, protocol, fsck):
    """With uploadpack.allowRefInWant a v2 client sends `want-ref` lines."""
    st = run_differential(servers, tmp_path, protocol, fsck, [
        lambda c: c.git("init", "-q", "--bare", str(c.dest), cwd=c.dest.parent),
        lambda c: c.git("fetch", "-q", "--no-tags", c.url("refinwant.git"), "main:refs/heads/main", "topic:refs/heads/t"),
    ])
    server = str(servers.repo("refinwant.git"))
    assert st["refs"] == {"refs/heads/main": h.out("rev-parse", "main", cwd=server),
                          "refs/heads/t": h.out("rev-parse", "topic", cwd=server)}

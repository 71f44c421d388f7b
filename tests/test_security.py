"""Security (issue 8, part 4), each rule checked beside stock `git http-backend`:
receive-pack only as the contract enables it; hideRefs in the v0 and v2
advertisements, in wants (v0 and v2) and in pushes; the export rules; no file
from outside a repository through the dumb routes (symbolic links, FIFOs,
alternates, `..` and encoded forms); Aspen's state (ref store, WAL, cache,
stored packs), hooks and config never served; the ownership check
(`safe.directory`).

Where Aspen is stricter than stock the test says so and shows what stock does:
stock serves a symbolic link's target from anywhere, and its protocol v2
upload-pack sends any object by id, hidden or not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from aspen_cgi import settings

from . import differential as d
from . import harness as h

pytestmark = pytest.mark.timeout(300)

UP_CT = "application/x-git-upload-pack-request"
ZERO = "0" * 40


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    repo = h.make_history(r / "repo.git")
    # a commit (and a blob in its tree) only a hidden ref reaches, and a commit a visible branch also reaches
    g = lambda *a, **k: h.git(*a, cwd=str(repo), **k).stdout.decode().strip()  # noqa: E731
    blob = g("hash-object", "-w", "--stdin", input=b"hidden payload\n")
    tree = g("mktree", input=f"100644 blob {blob}\tsecret.txt\n".encode())
    secret = g("commit-tree", "-p", "main", "-m", "secret", tree)
    h.git("update-ref", "refs/hidden/secret", secret, cwd=str(repo))
    h.git("update-ref", "refs/hidden/shared", "topic", cwd=str(repo))
    elsewhere = g("commit-tree", "-p", "main", "-m", "another namespace", "main^{tree}")
    for ns, rev in (("ns", "main~1"), ("other", elsewhere)):
        h.git("update-ref", f"refs/namespaces/{ns}/refs/heads/main", rev, cwd=str(repo))
    h.git("symbolic-ref", "refs/namespaces/ns/HEAD", "refs/namespaces/ns/refs/heads/main", cwd=str(repo))
    return r


def rev(root: Path, what: str) -> str:
    return h.out("rev-parse", what, cwd=str(root / "repo.git"))


def config(root: Path, *pairs: tuple[str, str]) -> None:
    for k, v in pairs:
        h.git("config", "--add", k, v, cwd=str(root / "repo.git"))


def both(env: dict, body: bytes = b"") -> tuple[h.CgiResult, h.CgiResult]:
    return h.stock(env, body), h.aspen(env, body)


def upload(root: Path, body: bytes, protocol: str = "", **extra) -> tuple[h.CgiResult, h.CgiResult]:
    env = d.post_env(root, "repo.git", "upload-pack", body, **extra)
    if protocol:
        env["GIT_PROTOCOL"] = protocol
    return both(env, body)


def v2_fetch(*args: str) -> bytes:
    return d.v2_request("fetch", ("object-format=sha1",), args)


def sent_objects(r: h.CgiResult, repo: Path) -> set:
    """The objects of the pack in an upload-pack answer (empty when it is an ERR)."""
    if b"ERR upload-pack: not our ref" in r.body:
        return set()
    return d.parse_upload_response(r.body, str(repo)).objects


# ---------------------------------------------------------------- receive-pack enablement

PUSH_CASES = [  # http.receivepack, REMOTE_USER, expected status
    (None, None, 403), (None, "alice", 200),
    ("false", None, 403), ("false", "alice", 403),
    ("true", None, 200), ("true", "alice", 200),
    ("not-a-bool", "alice", (500, 403)),
]


@pytest.mark.parametrize("setting,user,status", PUSH_CASES)
def test_receive_pack_only_as_the_contract_enables_it(root, setting, user, status):
    """http.receivepack unset: a user is needed; false: 403 even with one;
    true: anonymous pushes allowed. The same for the advertisement and the
    POST, as stock; a refused POST changes nothing."""
    if setting is not None:
        config(root, ("http.receivepack", setting))
    before = h.refs_of(str(root / "repo.git"))
    extra = {"REMOTE_USER": user} if user else {}
    s, a = both(d.env_for(root, "/repo.git/info/refs", "GET", "service=git-receive-pack", **extra))
    if isinstance(status, tuple):
        # a value that is no boolean: stock dies (500, `bad boolean config value`); Aspen refuses (403)
        assert (s.status, a.status) == status
        return
    assert (s.status, a.status) == (status, status)
    if status == 403:
        assert a.body == s.body == b""
    else:
        assert d.norm_advertisement(a.body) == d.norm_advertisement(s.body)
    empty_pack = h.git("pack-objects", "--stdout", "-q", cwd=str(root / "repo.git"), input=b"").stdout
    body = d.pkt(f"{ZERO} {rev(root, 'main')} refs/heads/pushed\0report-status\n") + d.FLUSH + empty_pack
    rs, ra, _ = d.triplicate(root)
    s = h.stock(d.post_env(rs, "repo.git", "receive-pack", body, **extra), body)
    a = h.aspen(d.post_env(ra, "repo.git", "receive-pack", body, **extra), body)
    assert (s.status, a.status) == (status, status)
    if status == 403:
        assert h.refs_of(str(ra / "repo.git")) == before == h.refs_of(str(rs / "repo.git"))
    else:
        assert h.refs_of(str(ra / "repo.git")) == h.refs_of(str(rs / "repo.git"))
        assert h.refs_of(str(ra / "repo.git"))["refs/heads/pushed"] == rev(root, "main")


def test_a_request_header_never_names_the_user(root, tmp_path):
    """Over real HTTP: Remote-User and X-Remote-User headers do not enable a
    push (REMOTE_USER comes only from the server, or from the one header
    ASPEN_REMOTE_USER_HEADER names)."""
    s = h.Server(root, {}).start()
    try:
        import http.client
        for hdrs in ({"Remote-User": "admin"}, {"X-Remote-User": "admin"}, {"REMOTE_USER": "admin"}):
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
            conn.request("GET", "/repo.git/info/refs?service=git-receive-pack", headers=hdrs)
            r = conn.getresponse()
            assert r.status == 403, hdrs
            r.read()
            conn.close()
    finally:
        s.stop()
    s = h.Server(root, {"ASPEN_REMOTE_USER_HEADER": "X-Remote-User"}).start()
    try:
        import http.client
        for hdrs, status in (({"X-Remote-User": "alice"}, 200), ({"Remote-User": "alice"}, 403), ({}, 403)):
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
            conn.request("GET", "/repo.git/info/refs?service=git-receive-pack", headers=hdrs)
            r = conn.getresponse()
            assert r.status == status, hdrs
            r.read()
            conn.close()
    finally:
        s.stop()


# ---------------------------------------------------------------- hideRefs in advertisements

HIDE_CASES = {
    "uploadpack": ([("uploadpack.hideRefs", "refs/hidden")], None),
    "transfer": ([("transfer.hideRefs", "refs/hidden")], None),
    "receive-only": ([("receive.hideRefs", "refs/hidden")], None),
    "negation": ([("transfer.hideRefs", "refs/hidden"), ("uploadpack.hideRefs", "!refs/hidden/shared"),
                  ("transfer.hideRefs", "refs/tags"), ("receive.hideRefs", "!refs/tags/v1.0")], None),
    "head": ([("uploadpack.hideRefs", "HEAD")], None),
    "namespace": ([("uploadpack.hideRefs", "refs/hidden")], "ns"),
    "namespace-full-name": ([("transfer.hideRefs", "^refs/namespaces/ns/refs/heads/main")], "ns"),
}


@pytest.mark.parametrize("case", sorted(HIDE_CASES))
def test_hide_refs_in_every_advertisement_as_stock(root, case):
    """v0/v1 upload-pack and receive-pack advertisements and v2 ls-refs (with
    and without ref-prefix, with peel/symrefs) are stock's, byte for byte
    (agent aside), and never name a hidden ref."""
    pairs, ns = HIDE_CASES[case]
    config(root, *pairs)
    extra = {"GIT_NAMESPACE": ns} if ns else {}
    hidden_names = []
    if any(v.endswith("refs/hidden") for k, v in pairs if not k.startswith("receive")):
        hidden_names.append(b"refs/hidden/secret")
    for svc in ("upload-pack", "receive-pack"):
        for proto in ("", "version=1"):
            env = d.env_for(root, "/repo.git/info/refs", "GET", f"service=git-{svc}", REMOTE_USER="alice", **extra)
            if proto:
                env["GIT_PROTOCOL"] = proto
            s, a = both(env)
            assert s.status == a.status == 200
            assert d.norm_advertisement(a.body) == d.norm_advertisement(s.body), (svc, proto)
            if svc == "upload-pack":
                for name in hidden_names:
                    assert name not in a.body
    for args in ((), ("peel", "symrefs"), ("ref-prefix refs/hidden/",), ("ref-prefix refs/", "ref-prefix HEAD"),
                 ("ref-prefix refs/hidden/secret", "peel")):
        body = d.v2_request("ls-refs", ("object-format=sha1",), args)
        s, a = upload(root, body, "version=2", **extra)
        assert s.status == a.status == 200
        assert a.body == s.body, args
        for name in hidden_names:
            assert name not in a.body


# ---------------------------------------------------------------- wants of hidden objects

ALLOW = {
    "none": [],
    "tip": [("uploadpack.allowTipSHA1InWant", "true")],
    "reachable": [("uploadpack.allowReachableSHA1InWant", "true")],
    "any": [("uploadpack.allowAnySHA1InWant", "true")],
}


@pytest.mark.parametrize("allow", sorted(ALLOW))
def test_wants_of_hidden_objects_v0_as_stock_and_v2_held_to_the_same_rule(root, allow):
    """A want of the hidden tip (only a hidden ref reaches it), of a commit a
    hidden ref and a visible one both reach, and of a blob: v0 answers are
    stock's (the ERR line, or a pack of the same objects). In v2 stock sends
    every object it has; Aspen gives v2 the decision v0 gets."""
    config(root, ("uploadpack.hideRefs", "refs/hidden"), *ALLOW[allow])
    repo = root / "repo.git"
    secret, shared, old = rev(root, "refs/hidden/secret"), rev(root, "refs/hidden/shared"), rev(root, "main~2")
    blob, hidden_blob = rev(root, "main:README"), rev(root, "refs/hidden/secret:secret.txt")
    for want in (secret, shared, old, blob):
        s0, a0 = upload(root, d.v0_request([want]))
        assert s0.status == a0.status == 200
        refused_v0 = b"ERR upload-pack: not our ref" in s0.body
        assert (b"ERR upload-pack: not our ref" in a0.body) == refused_v0, (want, a0.body[:200])
        assert sent_objects(a0, repo) == sent_objects(s0, repo)
        s2, a2 = upload(root, v2_fetch(f"want {want}", "no-progress", "done"), "version=2")
        assert s2.status == a2.status == 200
        assert b"ERR" not in s2.body              # stock's v2: any object, hidden or not
        refused_v2 = b"ERR upload-pack: not our ref " + want.encode() in a2.body
        assert refused_v2 == refused_v0, (allow, want)
        if not refused_v2:
            assert sent_objects(a2, repo) == sent_objects(s2, repo)
    expected = {"none": {secret}, "tip": set(), "reachable": set(), "any": set()}[allow]
    refused = {w for w in (secret, shared, old, blob)
               if b"not our ref" in upload(root, v2_fetch(f"want {w}", "done"), "version=2")[1].body}
    assert refused == expected
    # a blob only the hidden ref reaches: stock sends it in v0 (its reachability check walks commits
    # only) and in v2; Aspen refuses it in both, unless hidden refs count as ours (allowReachable, allowAny)
    s0, a0 = upload(root, d.v0_request([hidden_blob]))
    s2, a2 = upload(root, v2_fetch(f"want {hidden_blob}", "done"), "version=2")
    assert hidden_blob in sent_objects(s0, repo) and hidden_blob in sent_objects(s2, repo)
    for a in (a0, a2):
        assert a.status == 200
        assert (b"ERR upload-pack: not our ref " + hidden_blob.encode() in a.body) == (allow in ("none", "tip"))


def test_wants_outside_the_namespace_are_refused_in_v2(root):
    """GIT_NAMESPACE=ns: the commit only another namespace's ref reaches is
    refused (stock's v2 sends it); ns's own values are served."""
    secret, inside = rev(root, "refs/namespaces/other/refs/heads/main"), rev(root, "main~1")
    s, a = upload(root, v2_fetch(f"want {secret}", "done"), "version=2", GIT_NAMESPACE="ns")
    assert b"ERR upload-pack: not our ref " + secret.encode() in a.body
    assert b"packfile\n" in s.body
    s, a = upload(root, v2_fetch(f"want {inside}", "no-progress", "done"), "version=2", GIT_NAMESPACE="ns")
    assert sent_objects(a, root / "repo.git") == sent_objects(s, root / "repo.git") != set()


def test_stored_packs_never_carry_a_hidden_refs_objects(root, tmp_path):
    """With version packs built (the import holds every object, the hidden
    commit too), a v2 or v0 want of the hidden commit is refused and a clone
    over HTTP gets no object only the hidden ref reaches (the planner's own
    test of this is test_planned_fetch.py::test_hidden_refs_objects_never_sent_from_stored_packs)."""
    config(root, ("uploadpack.hideRefs", "refs/hidden"))
    repo = root / "repo.git"
    p = h.aspen_cli("import", str(repo))
    assert p.returncode == 0, p.stderr.decode()
    secret = rev(root, "refs/hidden/secret")
    env = {"ASPEN_VERSION_PACKS": "auto"}
    for body, proto in ((v2_fetch(f"want {secret}", "done"), "version=2"), (d.v0_request([secret]), "")):
        e = d.post_env(root, "repo.git", "upload-pack", body, **env)
        if proto:
            e["GIT_PROTOCOL"] = proto
        assert b"ERR upload-pack: not our ref " + secret.encode() in h.aspen(e, body).body
    s = h.Server(root, env).start()
    try:
        for version in ("0", "2"):
            dest = tmp_path / f"clone-v{version}"
            h.git("-c", f"protocol.version={version}", "clone", "-q", "--mirror", f"{s.url}/repo.git", str(dest))
            h.fsck_strict(str(dest))
            assert h.git("cat-file", "-e", secret, cwd=str(dest), check=False).returncode != 0
            visible = {k: v for k, v in h.refs_of(str(repo)).items() if not k.startswith("refs/hidden/")}
            assert h.refs_of(str(dest)) == visible
    finally:
        s.stop()
    assert "Traceback" not in s.log_text()


# ---------------------------------------------------------------- pushes to hidden refs

@pytest.mark.parametrize("key", ["receive.hideRefs", "transfer.hideRefs"])
def test_pushes_to_hidden_refs_are_refused_as_stock(root, key):
    """Create, update and delete of a hidden ref: `ng <ref> deny updating|deleting
    a hidden ref`, byte for byte stock's report; no ref moves. A `!` pattern
    makes a ref under the hidden prefix pushable again."""
    config(root, ("http.receivepack", "true"), (key, "refs/hidden"), (key, "!refs/hidden/open"))
    main, secret = rev(root, "main"), rev(root, "refs/hidden/secret")
    empty_pack = h.git("pack-objects", "--stdout", "-q", cwd=str(root / "repo.git"), input=b"").stdout
    for cmds in ([(ZERO, main, "refs/hidden/new")], [(secret, main, "refs/hidden/secret")],
                 [(secret, ZERO, "refs/hidden/secret")],
                 [(ZERO, main, "refs/hidden/new2"), (ZERO, main, "refs/heads/visible-too")]):
        lines = b"".join(d.pkt(f"{o} {n} {r}" + ("\0report-status delete-refs" if i == 0 else "") + "\n")
                         for i, (o, n, r) in enumerate(cmds))
        body = lines + d.FLUSH + (empty_pack if any(n != ZERO for _, n, _ in cmds) else b"")
        rs, ra, _ = d.triplicate(root)
        s = h.stock(d.post_env(rs, "repo.git", "receive-pack", body), body)
        a = h.aspen(d.post_env(ra, "repo.git", "receive-pack", body), body)
        assert s.status == a.status == 200
        assert a.body == s.body, (cmds, a.body, s.body)
        assert b"hidden ref" in a.body
        assert h.refs_of(str(ra / "repo.git")) == h.refs_of(str(rs / "repo.git"))
        assert h.refs_of(str(ra / "repo.git"))["refs/hidden/secret"] == secret
    body = d.pkt(f"{ZERO} {main} refs/hidden/open\0report-status\n") + d.FLUSH + empty_pack
    rs, ra, _ = d.triplicate(root)
    s = h.stock(d.post_env(rs, "repo.git", "receive-pack", body), body)
    a = h.aspen(d.post_env(ra, "repo.git", "receive-pack", body), body)
    assert a.body == s.body and b"ok refs/hidden/open" in a.body
    assert h.refs_of(str(ra / "repo.git"))["refs/hidden/open"] == main


# ---------------------------------------------------------------- export rules

EXPORT_ROUTES = [("/repo.git/HEAD", "GET", None), ("/repo.git/info/refs", "GET", None),
                 ("/repo.git/info/refs", "GET", "service=git-upload-pack"),
                 ("/repo.git/objects/info/packs", "GET", None), ("/repo.git/git-upload-pack", "POST", None)]


def test_export_rules_as_stock(root):
    """Without GIT_HTTP_EXPORT_ALL a repository is served only with
    git-daemon-export-ok (404 otherwise, on every route, dumb and smart)."""
    main = rev(root, "main")
    body = d.v0_request([main])
    for marker in (False, True):
        if marker:
            (root / "repo.git" / "git-daemon-export-ok").write_text("")
        for path, method, query in EXPORT_ROUTES:
            env = d.env_for(root, path, method, query, GIT_HTTP_EXPORT_ALL=None)
            if method == "POST":
                env.update(CONTENT_TYPE=UP_CT, CONTENT_LENGTH=str(len(body)))
            s, a = both(env, body if method == "POST" else b"")
            assert s.status == a.status == (200 if marker else 404), (path, query, marker)
            if not marker:
                assert a.body == s.body == b""
                assert b"Repository not exported" in a.stderr and b"Repository not exported" in s.stderr
    (root / "repo.git" / "git-daemon-export-ok").unlink()
    s, a = both(d.env_for(root, "/repo.git/HEAD", GIT_HTTP_EXPORT_ALL=""))
    assert s.status == a.status == 200      # set, even empty, exports everything


# ---------------------------------------------------------------- no file from outside a repository

def _links(root: Path, outside: Path) -> dict[str, str]:
    """Dumb-route names in repo.git linked to files outside it -> the linked file's text."""
    repo = root / "repo.git"
    h.git("repack", "-adq", cwd=str(repo))
    other = h.make_history(root / "other.git", commits=2, branches=())
    h.git("repack", "-adq", cwd=str(other))
    other_pack = sorted((other / "objects" / "pack").glob("*.pack"))[0]
    secret_file = outside / "secret.txt"
    secret_file.write_text("top secret\n")
    links = {
        "objects/pack/pack-" + "1" * 40 + ".pack": str(secret_file),
        "objects/pack/pack-" + "1" * 40 + ".idx": "/etc/passwd",
        "objects/pack/pack-" + "2" * 40 + ".pack": str(other_pack),       # another repository of the root
        "objects/" + "ab/" + "c" * 38: str(secret_file),
        "objects/info/alternates": str(secret_file),
        "objects/info/http-alternates": "../../../other.git/config",         # relative, out of the repository
    }
    for name, target in links.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).symlink_to(target)
    return links


def test_dumb_routes_serve_no_file_from_outside_the_repository(root, tmp_path):
    """Loose objects, packs, indexes and alternates files linked out of the
    repository: stock serves the link's target (shown here); Aspen answers
    404 as for a missing file. A FIFO is not served either (stock blocks on it)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    links = _links(root, outside)
    for name, target in links.items():
        env = d.env_for(root, "/repo.git/" + name)
        s, a = both(env)
        assert s.status == 200 and s.body == Path(os.path.join(root / "repo.git" / name)).resolve().read_bytes()
        assert a.status == 404, name
        assert a.body == b""
        assert b"outside the repository" in a.stderr
    fifo = root / "repo.git" / "objects" / "cd"
    fifo.mkdir()
    os.mkfifo(fifo / ("e" * 38))
    a = h.aspen(d.env_for(root, "/repo.git/objects/cd/" + "e" * 38), timeout=30)
    assert a.status == 404 and b"not a regular file" in a.stderr


def test_links_inside_the_repository_and_a_linked_objects_directory_are_served_as_stock(root, tmp_path):
    """What stays served: a pack linked to a pack of the same repository, a
    regular alternates file naming another repository (its text, as stock),
    and every object file of a repository whose whole objects directory the
    operator moved elsewhere and linked."""
    repo = root / "repo.git"
    h.git("repack", "-adq", cwd=str(repo))
    pack = sorted((repo / "objects" / "pack").glob("*.pack"))[0]
    (repo / "objects" / "pack" / ("pack-" + "3" * 40 + ".pack")).symlink_to(pack.name)
    h.git("clone", "-q", "--bare", "--no-local", str(repo), str(root / "base.git"))
    (repo / "objects" / "info" / "alternates").write_text(f"{root / 'base.git' / 'objects'}\n")
    (repo / "objects" / "info" / "http-alternates").write_text("../../base.git/objects\n")
    names = ["objects/pack/pack-" + "3" * 40 + ".pack", "objects/pack/" + pack.name,
             "objects/pack/" + pack.with_suffix(".idx").name, "objects/info/alternates",
             "objects/info/http-alternates", "objects/info/packs"]
    for name in names:
        s, a = both(d.env_for(root, "/repo.git/" + name))
        assert s.status == a.status == 200, name
        assert a.body == s.body
    moved = tmp_path / "elsewhere" / "objects"
    moved.parent.mkdir()
    shutil.move(str(repo / "objects"), str(moved))
    (repo / "objects").symlink_to(moved)
    for name in names:
        s, a = both(d.env_for(root, "/repo.git/" + name))
        assert s.status == a.status == 200, name
        assert a.body == s.body


def test_head_and_refs_linked_out_of_the_repository_reveal_nothing(root, tmp_path):
    """HEAD linked to a file outside (holding a valid `ref:` line) makes the
    directory no repository (404, as stock); a loose ref linked to /etc/passwd
    or to another repository's ref file: every advertisement and the dumb
    info/refs are stock's (less the broken ref stock's v0 advertisement names
    with a zero id) and hold no line of the linked file."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "HEAD").write_text("ref: refs/heads/main\n")
    h.git("clone", "-q", "--bare", str(root / "repo.git"), str(root / "headless.git"))
    os.unlink(root / "headless.git" / "HEAD")
    (root / "headless.git" / "HEAD").symlink_to(outside / "HEAD")
    for path in ("/headless.git/HEAD", "/headless.git/info/refs"):
        s, a = both(d.env_for(root, path))
        assert s.status == a.status == 404
    other = h.make_history(root / "other.git", commits=1, branches=(), tags=False)
    refs = root / "repo.git" / "refs" / "heads"
    (refs / "passwd").symlink_to("/etc/passwd")
    (refs / "foreign").symlink_to(other / "refs" / "heads" / "main")
    for query, proto in ((None, ""), ("service=git-upload-pack", ""), ("service=git-upload-pack", "version=2")):
        env = d.env_for(root, "/repo.git/info/refs", "GET", query)
        if proto:
            env["GIT_PROTOCOL"] = proto
        s, a = both(env)
        assert s.status == a.status == 200
        if query:
            # stock also advertises the broken ref with a zero id (v0); Aspen leaves it out
            zero = d.pkt(f"{ZERO} refs/heads/passwd\n")
            assert d.norm_advertisement(a.body) == d.norm_advertisement(s.body).replace(zero, b""), proto
        else:
            assert a.body == s.body
        assert b"root:" not in a.body
    s, a = upload(root, d.v2_request("ls-refs", ("object-format=sha1",), ("peel", "symrefs")), "version=2")
    broken = [line for line in s.body.split(b"\n") if line.endswith(b" refs/heads/passwd")]
    assert len(broken) == 1 and broken[0][4:].startswith(ZERO.encode())     # stock's zero id again
    assert a.body == s.body.replace(broken[0] + b"\n", b"") and b"root:" not in a.body


PATH_FORMS = ["/repo.git/objects/info/../../config", "/repo.git/objects/../HEAD", "/repo.git/./HEAD",
              "/repo.git//HEAD", "/../root/repo.git/HEAD", "/repo.git/objects/info/..%2f..%2fconfig",
              "/repo.git/objects/info/%2e%2e/%2e%2e/config", "/repo.git/\xc0\xae\xc0\xae/HEAD",
              "/repo.git/objects/info/alternates/../../../config", "/repo.git\\..\\HEAD",
              "/repo.git/config", "/repo.git/hooks/pre-receive.sample", "/repo.git/packed-refs",
              "/repo.git/description", "/repo.git/info/exclude", "/repo.git/aspen/aspen.sqlite3"]


@pytest.mark.parametrize("path", PATH_FORMS)
def test_dotdot_encoded_and_non_route_paths_get_stock_s_status(root, path):
    """`..`, `//`, encoded and overlong forms as PATH_INFO (already decoded by
    the web server; `%2f` that a server passes through stays literal), and
    files that are no route: stock's status, never a file's content."""
    env = d.env_for(root, path)
    s, a = both(env)
    assert a.status == s.status and a.status in (404, 500), (path, a.status)
    assert a.body == s.body == b""


def _state_files(root: Path, state: Path) -> list[Path]:
    return sorted(p for p in state.rglob("*") if p.is_file())


@pytest.mark.parametrize("where", ["in-repo", "state-dir-in-root"])
def test_aspen_state_is_never_served(root, tmp_path, where):
    """After fetches fill the response cache and `aspen import` writes version
    packs: every file of the state (aspen.sqlite3, its -wal/-shm, cache
    entries, stored packs and indexes), every repository file that is not a
    route (config, hooks, packed-refs) and objects linked to state files are
    404 or 500 over HTTP, in GIT_PROJECT_ROOT and PATH_TRANSLATED mode, even
    with ASPEN_STATE_DIR inside the project root."""
    repo = root / "repo.git"
    env = {} if where == "in-repo" else {"ASPEN_STATE_DIR": str(root / "state")}
    p = h.aspen_cli("import", str(repo)) if not env else None
    s = h.Server(root, dict(env, ASPEN_VERSION_PACKS="auto")).start()
    try:
        for version in ("0", "2"):
            h.git("-c", f"protocol.version={version}", "clone", "-q", f"{s.url}/repo.git", str(tmp_path / f"c{version}"))
    finally:
        s.stop()
    if p is not None:
        assert p.returncode == 0, p.stderr.decode()
    from aspen_cgi.runtime.statedir import state_dir
    state = Path(state_dir(str(repo), settings.of(dict(os.environ, **env))))
    files = _state_files(root, state)
    names = {f.name for f in files}
    record = h.store_file(repo)                     # the SQLite file, or the PostgreSQL store's record
    assert record in names and any(f.parent.name != state.name for f in files), names
    linked = repo / "objects" / "pack" / ("pack-" + "4" * 40 + ".pack")
    linked.symlink_to(state / record)
    loose = repo / "objects" / "ee" / ("f" * 38)
    loose.parent.mkdir(exist_ok=True)
    loose.symlink_to(files[-1])
    secrets = [f.read_bytes()[:64] for f in files if f.stat().st_size >= 64]
    paths = ["/" + str(f.relative_to(root)) for f in files if f.is_relative_to(root)]
    paths += ["/repo.git/" + str(f.relative_to(state)) for f in files]
    paths += ["/repo.git/config", "/repo.git/hooks/pre-receive.sample", "/repo.git/packed-refs",
              "/repo.git/objects/pack/" + linked.name, "/repo.git/objects/ee/" + "f" * 38]
    for path in paths:
        for mode_env in (d.env_for(root, path, **env),
                         {"REQUEST_METHOD": "GET", "GIT_HTTP_EXPORT_ALL": "1", "PATH_TRANSLATED": str(root) + path,
                          **env}):
            r = h.wsgi(mode_env)
            assert r.status in (404, 500), (path, r.status)
            assert not any(sec in r.body for sec in secrets if sec)
    # stock, for the links into the state: it serves them
    st = h.stock(d.env_for(root, "/repo.git/objects/pack/" + linked.name, **env))
    assert st.status == 200 and st.body == (state / record).read_bytes()


# ---------------------------------------------------------------- ownership

def test_repository_of_another_user_is_refused_unless_safe_directory(root, tmp_path):
    """A repository owned by nobody (the tests run as root): stock's 500
    `detected dubious ownership`, on dumb and smart routes, GET and POST,
    until safe.directory in the global config allows it (the repository's own
    config does not count)."""
    if os.geteuid() != 0:
        pytest.fail("this test chowns the repository: it runs as root (as CI does)")
    repo = root / "repo.git"
    main = rev(root, "main")
    nobody = 65534
    for dirpath, dirnames, filenames in os.walk(repo):
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), nobody, nobody)
    os.lchown(repo, nobody, nobody)
    home = tmp_path / "home"
    home.mkdir()
    body = d.v0_request([main])
    requests = [(d.env_for(root, "/repo.git/info/refs", HOME=str(home)), b""),
                (d.env_for(root, "/repo.git/HEAD", HOME=str(home)), b""),
                (d.env_for(root, "/repo.git/info/refs", "GET", "service=git-upload-pack", HOME=str(home)), b""),
                (dict(d.post_env(root, "repo.git", "upload-pack", body), HOME=str(home)), body)]
    for env, b in requests:
        s, a = both(env, b)
        assert s.status == a.status == 500, env["PATH_INFO"]
        assert a.body == s.body == b""
        assert f"detected dubious ownership in repository at '{repo}'".encode() in a.stderr
    h.git("config", "-f", str(repo / "config"), "safe.directory", "*")
    s, a = both(*requests[0])
    assert s.status == a.status == 500
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {repo}\n")
    for env, b in requests:
        s, a = both(env, b)
        assert s.status == a.status == 200, env["PATH_INFO"]

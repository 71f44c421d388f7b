"""aspen-cgi's recorded answers (aspen_cgi/http/replay.py): a request whose
inputs are unchanged gets the recorded bytes back without the pipeline; any
change to an input (refs, HEAD, configuration, export file, shallow file,
the user, the cache entry) and the pipeline answers again, with the same
bytes the pipeline gives a request that was never recorded.

The reference answer for each state comes from aspen-cgi with one extra
environment variable of its own (a new key: never replayed), and every
answer, replayed or not, is also compared with stock's to the same request
(status, headers as the differential tests compare them, body). Files are
aged past the racy window after each change, as a poller meets a repository
whose last push was more than a tenth of a second ago."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from .cgiserver import cgi_server_factory  # noqa: F401
from .differential import check_like_stock
from .harness import aspen, aspen_cli, git, make_history, out, stock

ADVERT = {"REQUEST_METHOD": "GET", "QUERY_STRING": "service=git-upload-pack", "GIT_HTTP_EXPORT_ALL": "1"}


def _age(*roots: Path) -> None:
    """Every file and directory under ROOTS (and the roots) one second old, as
    on a repository nobody pushed to within the racy window."""
    then = time.time_ns() - 1_000_000_000
    for root in roots:
        if not root.exists():
            continue
        os.utime(root, ns=(then, then), follow_symlinks=False)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                os.utime(os.path.join(dirpath, name), ns=(then, then), follow_symlinks=False)


def _ask(env: dict, body: bytes = b"", fresh: bool = False):
    """Aspen's answer to ENV and BODY, checked against stock's, and whether it was replayed."""
    e = dict(env, ASPEN_ACCESS_LOG="1")
    if fresh:
        e["ASPEN_TEST_KEY"] = uuid.uuid4().hex      # a key of its own: the pipeline answers
    res = aspen(e, body)
    check_like_stock(env, body, res)
    return res, b"replayed=1" in res.stderr


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    bare = make_history(root / "r.git", commits=4)
    home = tmp_path / "home"
    home.mkdir()
    return root, bare, home


def _env(root: Path, home: Path, **extra) -> dict:
    return {**ADVERT, "GIT_PROJECT_ROOT": str(root), "PATH_INFO": "/r.git/info/refs", "HOME": str(home), **extra}


def _settled(env: dict, body: bytes, *paths: Path):
    """The pipeline's answer in the current state, then the same request twice:
    the second is replayed, and all three carry the same bytes."""
    _age(*paths)
    ref, replayed = _ask(env, body, fresh=True)
    assert not replayed
    _age(*paths)        # the first request made the repository's aspen/: within the racy window nothing is kept
    first, _ = _ask(env, body)
    second, replayed = _ask(env, body)
    assert replayed, f"not replayed: {second.stderr!r}"
    assert (first.status, first.raw_head, first.body) == (ref.status, ref.raw_head, ref.body)
    assert (second.status, second.raw_head, second.body) == (ref.status, ref.raw_head, ref.body)
    return second


def _changes(bare: Path, home: Path):
    head = out("rev-parse", "main", cwd=str(bare))
    yield "update a ref", lambda: git("update-ref", "refs/heads/main", "main~1", cwd=str(bare))
    yield "a branch in a new directory", lambda: git("branch", "feature/x", head, cwd=str(bare))
    yield "delete a branch", lambda: git("branch", "-D", "topic", cwd=str(bare))
    yield "pack the refs", lambda: git("pack-refs", "--all", "--prune", cwd=str(bare))
    yield "a tag", lambda: git("tag", "later", head, cwd=str(bare))
    yield "move HEAD", lambda: git("symbolic-ref", "HEAD", "refs/heads/feature/x", cwd=str(bare))
    yield "hide tags in the repository's config", lambda: git("config", "uploadpack.hiderefs", "refs/tags",
                                                              cwd=str(bare))
    yield "hide branches in the global config", lambda: (home / ".gitconfig").write_text(
        "[uploadpack]\n\thiderefs = refs/heads/feature\n")
    yield "a shallow file", lambda: (bare / "shallow").write_text(head + "\n")


def test_advertisement_is_replayed_until_an_input_changes(repo):
    root, bare, home = repo
    env = _env(root, home)
    seen = set()
    _settled(env, b"", bare, home)
    for what, change in _changes(bare, home):
        change()
        after = _settled(env, b"", bare, home)
        assert after.status == 200, what
        if what != "pack the refs":
            assert after.body not in seen, f"{what}: the answer did not change"
        seen.add(after.body)


def test_v2_ls_refs_is_replayed_until_an_input_changes(repo):
    root, bare, home = repo
    env = _env(root, home, REQUEST_METHOD="POST", PATH_INFO="/r.git/git-upload-pack", QUERY_STRING="",
               HTTP_GIT_PROTOCOL="version=2", CONTENT_TYPE="application/x-git-upload-pack-request")
    from aspen_cgi.protocol.pktline import DELIM, FLUSH, encode
    body = (encode(b"command=ls-refs\n") + encode(b"agent=git/2.39.5\n") + DELIM + encode(b"peel\n")
            + encode(b"symrefs\n") + encode(b"ref-prefix HEAD\n") + encode(b"ref-prefix refs/heads/") + FLUSH)
    env["CONTENT_LENGTH"] = str(len(body))
    seen = set()
    for what, change in [("as made", lambda: None)] + list(_changes(bare, home)):
        change()
        after = _settled(env, body, bare, home)
        assert after.status == 200 and after.body.endswith(b"0000"), what
        seen.add(after.body)
    assert len(seen) >= 5


def test_receive_pack_advertisement_is_replayed_until_a_ref_changes_never_with_a_nonce_or_alternates(repo):
    """A push's first request: recorded and replayed as the upload-pack
    advertisement is, with the same bytes, until a ref changes; never with
    receive.certNonceSeed (a nonce each time) or alternates (their refs are
    shown as .have and are not among the watched inputs)."""
    root, bare, home = repo
    git("config", "http.receivepack", "true", cwd=str(bare))
    env = _env(root, home, QUERY_STRING="service=git-receive-pack")
    first = _settled(env, b"", bare, home)
    assert first.status == 200 and b"report-status" in first.body
    git("update-ref", "refs/heads/main", "main~1", cwd=str(bare))
    after = _settled(env, b"", bare, home)
    assert after.body != first.body
    git("config", "receive.certNonceSeed", "s3cret", cwd=str(bare))
    _age(bare, home)
    for _ in range(2):
        res, replayed = _ask(env)
        assert res.status == 200 and b"push-cert=" in res.body and not replayed
    git("config", "--unset", "receive.certNonceSeed", cwd=str(bare))
    other = make_history(root / "other.git", commits=2)
    (bare / "objects" / "info").mkdir(exist_ok=True)
    (bare / "objects" / "info" / "alternates").write_text(str(other / "objects") + "\n")
    _age(bare, home, other)
    for _ in range(2):
        res, replayed = _ask(env)
        assert res.status == 200 and b".have" in res.body and not replayed


def test_what_varies_per_client_shares_an_answer_and_the_user_does_not(repo):
    root, bare, home = repo
    env = _env(root, home, REMOTE_ADDR="10.0.0.1", HTTP_USER_AGENT="git/2.39.5")
    _settled(env, b"", bare, home)
    _, replayed = _ask(dict(env, REMOTE_ADDR="10.0.0.2", REMOTE_PORT="4711", HTTP_USER_AGENT="git/2.47.0"))
    assert replayed
    _, replayed = _ask(dict(env, REMOTE_USER="alice"))
    assert not replayed
    _, replayed = _ask(dict(env, HTTP_GIT_PROTOCOL="version=2"))
    assert not replayed


def test_a_repository_no_longer_exported_gets_stocks_404(repo):
    root, bare, home = repo
    (bare / "git-daemon-export-ok").write_text("")
    env = _env(root, home)
    del env["GIT_HTTP_EXPORT_ALL"]
    _settled(env, b"", bare, home)
    (bare / "git-daemon-export-ok").unlink()
    res, replayed = _ask(env)
    assert not replayed
    assert res.status == stock(env).status == 404


def test_racy_refs_are_not_recorded(repo):
    """A ref file written within the racy window of the answer: no entry, so a
    change in the same clock tick can never be hidden."""
    root, bare, home = repo
    env = _env(root, home)
    _age(bare, home)
    soon = time.time_ns() + 10_000_000_000
    os.utime(bare / "refs" / "heads", ns=(soon, soon))
    _ask(env)
    _, replayed = _ask(env)
    assert not replayed
    assert not (bare / "aspen" / "replay").exists() or not any(
        not p.name.startswith(".") for p in (bare / "aspen" / "replay").iterdir())


def test_a_damaged_entry_is_ignored(repo):
    root, bare, home = repo
    env = _env(root, home)
    good = _settled(env, b"", bare, home)
    for entry in (bare / "aspen" / "replay").iterdir():
        data = entry.read_bytes()
        entry.write_bytes(data[:len(data) // 2])
    res, replayed = _ask(env)
    assert not replayed and res.body == good.body
    for entry in (bare / "aspen" / "replay").iterdir():
        entry.write_bytes(b"aspen-replay 1\nnot numbers\n")
    res, replayed = _ask(env)
    assert not replayed and res.body == good.body


def test_a_deleted_repository_gets_404_and_nothing_is_made(repo):
    import shutil
    root, bare, home = repo
    env = _env(root, home)
    _settled(env, b"", bare, home)
    shutil.rmtree(bare)
    res, replayed = _ask(env)
    assert not replayed and res.status == 404
    assert not bare.exists()


def _objects(repo: Path) -> set[str]:
    return {line.split()[0] for line in out("rev-list", "--objects", "--all", cwd=str(repo)).splitlines()}


def test_clones_replay_the_cache_entry_and_count_the_hit(repo, tmp_path, cgi_server_factory):
    """The third identical clone is sent straight from the cache entry the
    second one hit; it passes fsck, and `aspen stats` counts it as a hit.
    Replacing the entry's file (as eviction or a wider depth-1 answer does)
    sends the next clone through the pipeline again."""
    root, bare, home = repo
    # imported by hand first: a hit is recorded only once the import's pack is final (built wide), and
    # a git answer made while packs were unbuilt is not recorded at all
    imp = aspen_cli("import", "-q", str(bare))
    assert imp.returncode == 0, imp.stderr
    _age(bare)
    server = cgi_server_factory(root, "aspen", ASPEN_ACCESS_LOG="1", HOME=str(home))
    url = f"{server.url}/r.git"
    refs = out("for-each-ref", "--format=%(objectname) %(refname)", cwd=str(bare))
    from_stock = tmp_path / "stock.git"
    git("clone", "-q", "--bare", f"{cgi_server_factory(root, 'stock', HOME=str(home)).url}/r.git", str(from_stock))

    def clone(n: int) -> str:
        """Clone N from Aspen: strict, with the server's refs and the objects a clone from stock has."""
        dest = tmp_path / f"c{n}"
        git("clone", "-q", "--bare", url, str(dest))
        git("fsck", "--strict", cwd=str(dest))
        assert out("for-each-ref", "--format=%(objectname) %(refname)", cwd=str(dest)) == refs
        assert _objects(dest) == _objects(from_stock)
        return server.log_text()

    clone(1)
    cache = bare / "aspen" / "cache"
    _age(cache)
    clone(2)
    log = clone(3)
    fetches = [line for line in log.splitlines() if line.startswith("aspen:") and "method=POST" in line
               and "service=upload-pack" in line and "cache=" in line]
    assert [("cache=hit" in f, "replayed=1" in f) for f in fetches] == [(False, False), (True, False), (True, True)], \
        "\n".join(fetches)
    assert "unrecorded=" not in fetches[1]
    events = (cache / "events.log").read_text().split()
    assert events.count("hit") == 2

    entry = next(p for p in cache.iterdir() if p.name.endswith(".entry") or p.suffix == "")
    data = entry.read_bytes()
    entry.unlink()
    entry.write_bytes(data)
    _age(cache)
    log = clone(4)
    last = [line for line in log.splitlines() if "method=POST" in line and "cache=" in line][-1]
    assert "replayed=1" not in last and "cache=hit" in last


def test_an_input_changed_while_the_answer_was_computed_is_not_recorded(repo):
    """The answer is computed from the state at the request's start; a ref
    that moved after that start (here: nine seconds into a ten-second
    request) leaves its new timestamp, and the answer is not kept, though it
    is far older than the racy window by the time the request ends."""
    from aspen_cgi.http import replay
    root, bare, home = repo
    env = _env(root, home)
    _age(bare, home)
    answer, _ = _ask(env, fresh=True)
    _age(bare, home)
    started = time.time_ns() - 10_000_000_000
    before = time.time_ns() - 500_000_000      # file times come from a coarser clock, a tick behind
    git("update-ref", "refs/heads/main", "main~1", cwd=str(bare))
    moved = started + 1_000_000_000
    for p in [bare, *bare.rglob("*")]:      # what the update wrote: its ref, and HEAD's lock in the git dir
        if p.lstat().st_mtime_ns >= before:
            os.utime(p, ns=(moved, moved), follow_symlinks=False)
    trace = {"repo": "/r.git", "service": "upload-pack"}
    why = replay.record(env, b"", str(bare), answer.raw_head + b"\r\n\r\n", answer.body, trace, started)
    assert why.startswith("racy:") and why.partition(":")[2] in {str(p) for p in [bare, *bare.rglob("*")]}
    assert replay.lookup(env) is None
    assert replay.record(env, b"", str(bare), answer.raw_head + b"\r\n\r\n", answer.body, trace, time.time_ns()) == ""


def test_pollers_arriving_together_compute_the_listing_once(repo):
    """Six identical advertisement requests at once, with nothing recorded:
    one runs the pipeline, the others wait for its record and replay it."""
    import subprocess

    from .harness import ASPEN_CGI, BASE_ENV, parse_cgi
    root, bare, home = repo
    env = _env(root, home)
    _ask(env, fresh=True)               # the ref store made (the git dir changes once)
    _age(bare, home)
    full = {**BASE_ENV, **env, "ASPEN_ACCESS_LOG": "1"}
    procs = [subprocess.Popen([ASPEN_CGI], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(6)]
    results = [p.communicate(timeout=60) for p in procs]
    bodies = {parse_cgi(out).body for out, _ in results}
    replayed = [b"replayed=1" in err for _, err in results]
    assert len(bodies) == 1
    check_like_stock(env, b"", parse_cgi(*results[0]))
    assert replayed.count(False) == 1, [err for _, err in results]


def test_a_refresh_records_stale_listings_and_leaves_them_to_the_next_push_in_a_burst(repo):
    """http/replayrefresh.refresh() after a ref changed: the stale advertisement
    is recorded again (the next request is replayed, with the pipeline's
    bytes); when another ref changes while it waits out the racy window (a
    burst of pushes), it records nothing and leaves them to that push."""
    import threading

    from aspen_cgi.http import replayrefresh
    root, bare, home = repo
    env = _env(root, home)
    _settled(env, b"", bare, home)
    git("update-ref", "refs/heads/main", "main~1", cwd=str(bare))
    assert replayrefresh.refresh(str(bare), dict(env, ASPEN_ACCESS_LOG="1")) == 1
    again, replayed = _ask(env)
    assert replayed
    ref, _ = _ask(env, fresh=True)
    assert (again.raw_head, again.body) == (ref.raw_head, ref.body)
    git("update-ref", "refs/heads/main", "main~1", cwd=str(bare))
    later = threading.Timer(replayrefresh.SETTLE_S / 3, lambda: git("branch", "burst", "main", cwd=str(bare)))
    later.start()
    assert replayrefresh.refresh(str(bare), dict(env, ASPEN_ACCESS_LOG="1")) == 0
    later.join()
    _, replayed = _ask(env)
    assert not replayed


def test_a_configuration_with_includes_is_never_recorded(repo):
    """An included file's name and time are not among the inputs replay
    watches, so nothing answered under such a configuration is recorded."""
    root, bare, home = repo
    extra = home / "extra.cfg"
    extra.write_text("[uploadpack]\n\thiderefs = refs/tags\n")
    git("config", "include.path", str(extra), cwd=str(bare))
    env = _env(root, home)
    _age(bare, home)
    for _ in range(3):
        res, replayed = _ask(env)
        assert not replayed and b"refs/tags/" not in res.body
    extra.write_text("[uploadpack]\n\thiderefs = refs/heads/topic\n")
    res, replayed = _ask(env)
    assert not replayed and b"refs/tags/" in res.body and b"refs/heads/topic" not in res.body


def _imported(env: dict) -> set[str]:
    """The modules one aspen-cgi request loads, as CPython's -X importtime lists them."""
    import subprocess
    import sys

    from .harness import ASPEN_CGI, BASE_ENV
    first = Path(ASPEN_CGI).read_bytes().split(b"\n", 1)[0].decode()
    if first == "#!/bin/sh":        # as pip installs it: sh execs Python with -I -S (and adds PWD to the environment)
        argv = ["/bin/sh", "-c", 'exec "$0" -I -S -X importtime "$1"', str(Path(sys.executable).parent / "python3"),
                ASPEN_CGI]
    else:                           # as `aspen install-cgi` leaves it: the interpreter and its flags on the #! line
        interpreter, flags = first[2:].split(" ", 1)
        argv = [interpreter, flags, "-X", "importtime", ASPEN_CGI]
    proc = subprocess.run(argv, env={**BASE_ENV, **env},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert proc.returncode == 0 and proc.stdout, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.decode().splitlines()
            if line.startswith("import time:") and "|" in line} - {"imported package"}


# What a replayed answer may load beside the interpreter's own start-up: the
# CGI program, settings, and the replay path (http/replay.py's imports).
REPLAY_PATH = {"aspen_cgi", "aspen_cgi.cgi", "aspen_cgi.settings", "aspen_cgi.model", "aspen_cgi.model.gitvalues",
               "aspen_cgi.model.racy",
               "aspen_cgi.http", "aspen_cgi.http.replay", "aspen_cgi.http.accesslog", "aspen_cgi.http.limits", "aspen_cgi.git",
               "aspen_cgi.git.configfiles", "aspen_cgi.runtime", "aspen_cgi.runtime.statedir"}


def test_a_replayed_answer_loads_only_the_replay_path(repo):
    """Each module costs every CGI request start-up time (json alone costs
    milliseconds, os about one): a replayed answer loads the replay path and
    nothing of the pipeline, not even os; one handed to the resident loads
    only handoff.py beside those; and a pipeline answer of an advertisement
    in-process loads no JSON, URL parsing, SQLite schema tool or pack
    library."""
    root, bare, home = repo
    env = dict(_env(root, home), ASPEN_ACCESS_LOG="1")
    _settled(env, b"", root, home)
    mods = _imported(env)
    assert {m for m in mods if m.startswith("aspen_cgi")} <= REPLAY_PATH
    assert "aspen_cgi.http.replay" in mods
    assert not mods & {"os", "posixpath", "json", "re", "typing", "dataclasses", "subprocess", "sqlite3", "hashlib"}
    handed = _imported(dict(env, ASPEN_TEST_KEY=uuid.uuid4().hex))     # to the resident (docs/cgi.md)
    assert {m for m in handed if m.startswith("aspen_cgi")} <= REPLAY_PATH | {"aspen_cgi.handoff"}
    assert "aspen_cgi.handoff" in handed
    assert not handed & {"os", "posixpath", "json", "re", "typing", "dataclasses", "subprocess", "socket"}
    pipeline = _imported(dict(env, ASPEN_TEST_KEY=uuid.uuid4().hex, ASPEN_CGI_RESIDENT="0"))
    assert "aspen_cgi.http.backend" in pipeline
    banned = {"json", "urllib.parse", "sqlite_utils", "dulwich", "aspen_cgi.planner.plan",
              "aspen_cgi.push.flow", "aspen_cgi.packs.splice"}
    if os.environ.get("ASPEN_TEST_REFSTORE") == "postgresql":
        banned -= {"json", "urllib.parse"}      # psycopg's own imports: a PostgreSQL store's start-up pays them
    assert not pipeline & banned


def test_two_requests_whose_keys_once_shared_a_slot_are_both_kept(repo, monkeypatch):
    """An entry's file is named by its key's whole CRC-32: two requests whose
    keys agree in the low byte (one of 256 names before, so that each record
    replaced the other's, and a poller alternating them was never replayed)
    are both recorded and both looked up. Past SLOTS entries the oldest go."""
    import zlib

    from aspen_cgi.http import replay
    root, bare, home = repo
    (bare / "aspen").mkdir()                                # the state directory a first request makes
    _age(bare, home)
    base = _env(root, home)
    first = dict(base, HTTP_X_PROBE="0")
    low = zlib.crc32(replay._key(first, b"")) & 0xFF
    n = 1
    while zlib.crc32(replay._key(second := dict(base, HTTP_X_PROBE=str(n)), b"")) & 0xFF != low:
        n += 1
    trace = {"repo": "/r.git", "service": "upload-pack"}
    now = time.time_ns()
    for env, text in ((first, b"first\n"), (second, b"second\n")):
        assert replay.record(env, b"", str(bare), b"Status: 200 OK\r\n\r\n", text, trace, now) == ""
    assert replay.lookup(first).body == b"first\n" and replay.lookup(second).body == b"second\n"
    monkeypatch.setattr(replay, "SLOTS", 2)
    third = dict(base, HTTP_X_PROBE="third")
    os.utime(bare / "aspen" / "replay" / replay._slot(replay._key(first, b"")), ns=(now - 10**9, now - 10**9))
    assert replay.record(third, b"", str(bare), b"Status: 200 OK\r\n\r\n", b"third\n", trace, now) == ""
    assert replay.lookup(first) is None                     # the oldest went
    assert replay.lookup(second).body == b"second\n" and replay.lookup(third).body == b"third\n"

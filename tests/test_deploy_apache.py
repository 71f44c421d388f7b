"""The shipped Apache configs (apache/*.conf), proved with the real Apache and real git clients.

Each deployment (CGI: apache/aspen-cgi.conf; mod_wsgi: apache/aspen-wsgi.conf +
apache/aspen.wsgi) is made from the shipped file by placeholder substitution
only, Included from a test-only wrapper (tests/deploy_apache.py), and served by
Apache in the foreground on a random loopback port. Its children run as
www-data (when the tests run as root), so Aspen is installed into a
world-readable venv once per session."""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from . import deploy_apache as da
from . import harness as h
from .harness import fsck_strict, git, make_history, out, refs_of

PROJECT = Path(__file__).resolve().parent.parent
if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))
from bench import repogen  # noqa: E402

MB = 1024 * 1024


@pytest.fixture(scope="session")
def install(tmp_path_factory) -> dict:
    """A world-readable install: venv with Aspen (non-editable), aspen.wsgi and a password file."""
    h.need_system("apache2", da.APACHE)
    h.need_system("libapache2-mod-wsgi-py3", str(da.MODULE_DIR / "mod_wsgi.so"))
    base = da.world_dir(Path(str(tmp_path_factory.mktemp("apache-install"))))
    venv = da.install_aspen(base)
    apache_dir = da.world_dir(base / "apache")
    shutil.copy(da.SHIPPED / "aspen.wsgi", apache_dir / "aspen.wsgi")
    os.chmod(apache_dir / "aspen.wsgi", 0o644)
    pw = da.htpasswd(apache_dir / "htpasswd")
    return {"VENV": str(venv), "ASPEN_CGI": str(venv / "bin" / "aspen-cgi"), "APACHE_DIR": str(apache_dir),
            "HTPASSWD": str(pw)}


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> Path:
    """The bench's `medium` preset repository (3,000 commits, 49,797 objects), generated once."""
    dest = Path(str(tmp_path_factory.mktemp("generated"))) / "medium.git"
    repogen.generate(repogen.PRESETS["medium"], dest)
    return dest


@pytest.fixture(scope="module", params=["cgi", "wsgi"])
def deployment(request, install, tmp_path_factory):
    """(Apache, project root) for one shipped deployment."""
    kind = request.param
    base = da.world_dir(Path(str(tmp_path_factory.mktemp(f"apache-{kind}"))))
    root = da.world_dir(base / "root")
    shipped = "aspen-cgi.conf" if kind == "cgi" else "aspen-wsgi.conf"
    values = dict(install, GIT_PROJECT_ROOT=str(root))
    server = da.start_apache(base / "server", shipped, values, "/git", wsgi=kind == "wsgi")
    server.kind = kind
    yield server, root
    server.stop()
    log = server.log()
    assert "Traceback" not in log, log[-4000:]


def new_repo(root: Path) -> tuple[str, Path]:
    name = f"r-{uuid.uuid4().hex[:8]}.git"
    make_history(root / name)
    da.open_up(root)
    return name, root / name


def check_mirror(client: Path, server_repo: Path) -> None:
    fsck_strict(str(client))
    assert refs_of(str(client)) == refs_of(str(server_repo))


def server_commit(server_repo: Path, tmp: Path, message: str) -> str:
    """A change made on the server outside HTTP (as root, like an admin or a hook): a new commit on main."""
    work = tmp / f"work-{uuid.uuid4().hex[:6]}"
    git("clone", "-q", str(server_repo), str(work))
    (work / "server-change.txt").write_text(message + "\n")
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", message, cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    da.open_up(server_repo)
    return out("rev-parse", "HEAD", cwd=str(work))


@pytest.mark.parametrize("version", ["0", "2"])
def test_clone(deployment, tmp_path, version):
    server, root = deployment
    name, repo = new_repo(root)
    dest = tmp_path / "mirror.git"
    p = git("-c", f"protocol.version={version}", "clone", "-q", "--mirror", server.url(name), str(dest),
            env={"GIT_TRACE_PACKET": "1"})
    trace = p.stderr.decode(errors="replace")
    spoke_v2 = re.search(r"git< version 2", trace) is not None
    assert spoke_v2 == (version == "2"), trace[-3000:]
    check_mirror(dest, repo)


def test_shallow_clone(deployment, tmp_path):
    server, root = deployment
    name, repo = new_repo(root)
    dest = tmp_path / "shallow"
    git("clone", "-q", "--depth", "1", server.url(name), str(dest))
    fsck_strict(str(dest))
    assert out("rev-list", "--count", "HEAD", cwd=str(dest)) == "1"
    assert (dest / ".git" / "shallow").read_text().split() == [out("rev-parse", "HEAD", cwd=str(dest))]
    assert out("rev-parse", "HEAD", cwd=str(dest)) == refs_of(str(repo))["refs/heads/main"]


def test_fetch_after_server_change(deployment, tmp_path):
    server, root = deployment
    name, repo = new_repo(root)
    dest = tmp_path / "mirror.git"
    git("clone", "-q", "--mirror", server.url(name), str(dest))
    check_mirror(dest, repo)
    new = server_commit(repo, tmp_path, "changed on the server")
    git("fetch", "-q", cwd=str(dest))
    assert refs_of(str(dest))["refs/heads/main"] == new
    check_mirror(dest, repo)


def test_authenticated_push(deployment, tmp_path):
    server, root = deployment
    name, repo = new_repo(root)
    work = tmp_path / "work"
    git("clone", "-q", server.url(name, auth=True), str(work))
    (work / "pushed.txt").write_text("pushed over HTTP\n")
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", "pushed", cwd=str(work))
    git("tag", "-a", "v9", "-m", "pushed tag", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", "HEAD:refs/heads/pushed", "v9", cwd=str(work))
    fsck_strict(str(work))
    fsck_strict(str(repo))
    head = out("rev-parse", "HEAD", cwd=str(work))
    refs = refs_of(str(repo))
    assert refs["refs/heads/main"] == refs["refs/heads/pushed"] == head
    assert refs["refs/tags/v9"] == out("rev-parse", "v9", cwd=str(work))
    # the refs the client sees over HTTP are the server's
    listed = out("ls-remote", server.url(name), cwd=str(work)).splitlines()
    remote = dict(reversed(line.split("\t", 1)) for line in listed if not line.endswith(("HEAD", "^{}")))
    assert remote == refs


def test_anonymous_push_refused(deployment, tmp_path):
    server, root = deployment
    name, repo = new_repo(root)
    before = refs_of(str(repo))
    assert da.http_status(server.url(name) + "/info/refs?service=git-receive-pack") == 401
    assert da.http_status(server.url(name) + "/git-receive-pack", "POST", b"0000",
                          {"Content-Type": "application/x-git-receive-pack-request"}) == 401
    assert da.http_status(server.url(name) + "/info/refs?service=git-upload-pack") == 200
    work = tmp_path / "work"
    git("clone", "-q", server.url(name), str(work))
    (work / "anon.txt").write_text("anonymous\n")
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", "anonymous", cwd=str(work))
    p = git("push", "origin", "HEAD:main", cwd=str(work), check=False, env={"GIT_TERMINAL_PROMPT": "0"})
    assert p.returncode != 0
    assert re.search(r"401|Authentication failed|could not read Username", p.stderr.decode(errors="replace"))
    assert refs_of(str(repo)) == before
    # a wrong password is refused too
    bad = server.url(name, auth=True).replace(da.PASSWORD, "wrong")
    p = git("push", bad, "HEAD:main", cwd=str(work), check=False, env={"GIT_TERMINAL_PROMPT": "0"})
    assert p.returncode != 0
    assert refs_of(str(repo)) == before
    fsck_strict(str(work))


def test_large_push(deployment, tmp_path):
    """A 100 MB incompressible blob is pushed; Apache's children and Aspen's processes
    (the CGI program or the mod_wsgi daemons) stay well under 100 MB of RSS meanwhile."""
    server, root = deployment
    name, repo = new_repo(root)
    work = tmp_path / "work"
    git("clone", "-q", server.url(name, auth=True), str(work))
    with open(work / "big.bin", "wb") as f:
        for _ in range(100):
            f.write(os.urandom(MB))
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", "100 MB", cwd=str(work))
    server.rss.clear()
    stop = threading.Event()
    sampler = threading.Thread(target=server.sample_rss, args=(stop,), daemon=True)
    sampler.start()
    try:
        git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    finally:
        stop.set()
        sampler.join()
    head = out("rev-parse", "HEAD", cwd=str(work))
    assert refs_of(str(repo))["refs/heads/main"] == head
    assert out("cat-file", "-s", "main:big.bin", cwd=str(repo)) == str(100 * MB)
    fsck_strict(str(work))
    ours = {n: kb for n, kb in server.rss.items() if not n.startswith("git")}
    assert ours, server.rss
    app = "aspen-cgi" if server.kind == "cgi" else "(wsgi:aspen)"
    assert app in ours, server.rss      # the sampler saw the program serving the push
    assert max(ours.values()) < 60 * 1024, f"RSS (kB) while pushing 100 MB: {server.rss}"


def test_large_clone(deployment, generated, tmp_path):
    server, root = deployment
    name = f"medium-{uuid.uuid4().hex[:6]}.git"
    shutil.copytree(generated, root / name)
    da.open_up(root)
    for version in ("0", "2"):
        dest = tmp_path / f"mirror-v{version}.git"
        git("-c", f"protocol.version={version}", "clone", "-q", "--mirror", server.url(name), str(dest))
        check_mirror(dest, root / name)
        assert int(out("rev-list", "--all", "--count", cwd=str(dest))) == 3000


def test_side_by_side(install, tmp_path):
    """apache/side-by-side.conf: stock at /stock/, Aspen at /aspen/, over the same repositories."""
    base = da.world_dir(tmp_path / "side")
    root = da.world_dir(base / "root")
    server = da.start_apache(base / "server", "side-by-side.conf", dict(install, GIT_PROJECT_ROOT=str(root)), "/aspen")
    try:
        name, repo = new_repo(root)
        stock, aspen = tmp_path / "stock.git", tmp_path / "aspen.git"
        git("clone", "-q", "--mirror", server.url(name, prefix="/stock"), str(stock))
        git("clone", "-q", "--mirror", server.url(name, prefix="/aspen"), str(aspen))
        check_mirror(stock, repo)
        check_mirror(aspen, repo)
        assert refs_of(str(stock)) == refs_of(str(aspen))
        # a push through stock is what Aspen serves next
        work = tmp_path / "work"
        git("clone", "-q", server.url(name, auth=True, prefix="/stock"), str(work))
        (work / "via-stock.txt").write_text("pushed through stock\n")
        git("add", "-A", cwd=str(work))
        git("commit", "-q", "-m", "via stock", cwd=str(work))
        git("push", "-q", "origin", "HEAD:main", cwd=str(work))
        git("fetch", "-q", cwd=str(aspen))
        assert refs_of(str(aspen))["refs/heads/main"] == out("rev-parse", "HEAD", cwd=str(work))
        check_mirror(aspen, repo)
        log = server.log()
        assert "aspen: repo=" in log          # /aspen/ really was Aspen
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["cgi", "wsgi"])
def test_a_setting_that_cannot_be_parsed_is_a_500_with_the_message_in_the_error_log(install, tmp_path, kind):
    """`SetEnv ASPEN_CACHE_MAX_BYTES 1x`: each request gets a 500 with a
    short body (aspen-cgi reads its settings per request; mod_wsgi passes
    SetEnv in each request's environ), and Apache's error log names the
    setting, the value and what it accepts, without a traceback."""
    from aspen_cgi.settings import REFUSED_BODY
    base = da.world_dir(tmp_path / kind)
    root = da.world_dir(base / "root")
    name, _ = new_repo(root)
    shipped = "aspen-cgi.conf" if kind == "cgi" else "aspen-wsgi.conf"
    server = da.start_apache(base / "server", shipped, dict(install, GIT_PROJECT_ROOT=str(root)), "/git",
                             wsgi=kind == "wsgi", extra=("SetEnv ASPEN_CACHE_MAX_BYTES 1x",))
    try:
        url = server.url(name) + "/info/refs?service=git-upload-pack"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                status, body = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        assert status == 500
        assert body == REFUSED_BODY
        log = server.log()
        assert ("aspen: bad setting ASPEN_CACHE_MAX_BYTES='1x': expected bytes, or a number with a k, m or g "
                "suffix (500m, 2g)") in log
        assert "Traceback" not in log
    finally:
        server.stop()

"""aspen-cgi's resident process (aspen_cgi/resident.py, handoff.py): a request
no recorded answer serves goes to it; it answers with the bytes the CGI
program answers in-process; it starts on first need, one per run directory;
it goes when its run directory goes, when it idles, when its code changes,
when it is killed; aspen-cgi then answers in-process. It serves only its
own user, and a request's environment is the worker's whole environment.
What it answers is also compared with stock's answer to the same request
(status, headers and body as the differential tests compare them).

Each test has a run directory of its own (ASPEN_RUN_DIR under tmp_path), so
its resident is its own and goes with the directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from aspen_cgi import handoff

from . import differential as d
from . import harness as h
from .cgiserver import cgi_server_factory  # noqa: F401


def _env(root: Path, run: Path, **extra: str) -> dict:
    return {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "ASPEN_RUN_DIR": str(run),
            "ASPEN_ACCESS_LOG": "1", "REQUEST_METHOD": "GET", "PATH_INFO": "/r.git/info/refs",
            "QUERY_STRING": "service=git-upload-pack", "REMOTE_ADDR": "127.0.0.1", **extra}


def _pid(run: Path) -> int | None:
    """The resident's pid from its lock file, while it serves its socket."""
    socks = list(run.glob("resident-*.sock"))
    if not socks:
        return None
    lock = socks[0].with_suffix(".lock")
    try:
        return int(lock.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(cond, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _started(root: Path, run: Path, **extra: str) -> int:
    """Send the first request (answered in-process, which starts the resident); its pid once it listens."""
    first = h.aspen(_env(root, run, ASPEN_N="0", **extra))
    assert first.status == 200 and b"resident=1" not in first.stderr
    return _wait(lambda: _pid(run), "the resident to listen")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    h.make_history(root / "r.git", commits=4)
    return root


def test_a_pipeline_request_goes_to_the_resident_and_gets_the_in_process_bytes(repo, tmp_path):
    run = tmp_path / "run"
    _started(repo, run)
    ls_refs = (b"0014command=ls-refs\n0015agent=git/2.39.5\n0001" + b"0009peel\n" + b"000csymrefs\n" + b"0000")
    cases = [
        ({}, b""),
        ({"REQUEST_METHOD": "POST", "PATH_INFO": "/r.git/git-upload-pack", "QUERY_STRING": "",
          "CONTENT_TYPE": "application/x-git-upload-pack-request", "HTTP_GIT_PROTOCOL": "version=2",
          "CONTENT_LENGTH": str(len(ls_refs))}, ls_refs),
        ({"PATH_INFO": "/r.git/HEAD", "QUERY_STRING": ""}, b""),
        ({"PATH_INFO": "/nothing.git/info/refs"}, b""),
    ]
    for i, (extra, body) in enumerate(cases):
        fresh = {**extra, "ASPEN_N": f"a{i}"}              # a key of its own: never a recorded answer
        via = h.aspen(_env(repo, run, **fresh), body)
        alone = h.aspen(_env(repo, run, ASPEN_CGI_RESIDENT="0", **fresh), body)
        assert b"resident=1" in via.stderr, via.stderr
        assert b"resident=1" not in alone.stderr
        assert (via.status, via.raw_head, via.body) == (alone.status, alone.raw_head, alone.body)
        d.check_like_stock(_env(repo, run, **fresh), body, via)


def test_git_clones_fetches_and_pushes_through_the_resident(repo, tmp_path, cgi_server_factory):
    run = tmp_path / "run"
    _started(repo, run)
    server = cgi_server_factory(repo, program="aspen", ASPEN_RUN_DIR=str(run), ASPEN_ACCESS_LOG="1",
                                GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.receivepack",
                                GIT_CONFIG_VALUE_0="true")
    clone = tmp_path / "clone"
    h.git("clone", "-q", f"{server.url}/r.git", str(clone))
    h.git("-C", str(clone), "commit", "-q", "--allow-empty", "-m", "through the resident")
    h.git("-C", str(clone), "push", "-q", "origin", "HEAD")
    other = tmp_path / "other"
    h.git("clone", "-q", "--bare", f"{server.url}/r.git", str(other))
    h.git("-C", str(other), "fetch", "-q", "--tags", f"{server.url}/r.git")
    h.fsck_strict(str(other))
    assert h.refs_of(str(other)) == h.refs_of(str(repo / "r.git"))
    from_stock = tmp_path / "from-stock"
    h.git("clone", "-q", "--bare", f"{cgi_server_factory(repo, 'stock').url}/r.git", str(from_stock))
    assert h.refs_of(str(other)) == h.refs_of(str(from_stock)) and _objects(other) == _objects(from_stock)
    log = server.log_text()
    assert "service=receive-pack" in log and log.count("resident=1") >= 4, log


def _objects(repo: Path) -> set[str]:
    return {line.split()[0] for line in h.out("rev-list", "--objects", "--all", cwd=str(repo)).splitlines()}


def test_a_push_through_the_resident_records_the_pollers_listings_again(repo, tmp_path, cgi_server_factory):
    """Pollers' advertisement (v0) and ls-refs (v2) are recorded; a push
    through the resident computes both again once its client has its answer
    (http/replayrefresh.py): the first poll after it is replayed, names the
    pushed commit, and is byte for byte the pipeline's answer now."""
    import urllib.request
    run = tmp_path / "run"
    _started(repo, run)
    push_env = dict(ASPEN_RUN_DIR=str(run), ASPEN_ACCESS_LOG="1", GIT_CONFIG_COUNT="1",
                    GIT_CONFIG_KEY_0="http.receivepack", GIT_CONFIG_VALUE_0="true")
    server = cgi_server_factory(repo, program="aspen", **push_env)
    from aspen_cgi.protocol.pktline import DELIM, FLUSH, encode
    ls_refs = (encode(b"command=ls-refs\n") + encode(b"agent=git/2.39.5\n") + DELIM + encode(b"peel\n")
               + encode(b"symrefs\n") + FLUSH)

    def poll(url: str, **headers: str) -> list[bytes]:
        get = urllib.request.Request(f"{url}/r.git/info/refs?service=git-upload-pack", headers=headers)
        post = urllib.request.Request(f"{url}/r.git/git-upload-pack", data=ls_refs, headers={
            "Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2", **headers})
        return [urllib.request.urlopen(get, timeout=60).read(), urllib.request.urlopen(post, timeout=60).read()]

    def polls_replayed() -> list[bool]:
        lines = [ln for ln in server.log_text().splitlines() if ln.startswith("aspen:") and "service=upload-pack" in ln]
        return ["replayed=1" in ln for ln in lines[-2:]]

    slots = repo / "r.git" / "aspen" / "replay"

    def recorded() -> dict[str, int]:
        return {p.name: p.stat().st_ino for p in slots.iterdir() if not p.name.startswith(".")} if slots.is_dir() else {}
    time.sleep(0.2)                                  # past the racy window of what the first request made
    poll(server.url)
    _wait(lambda: len(recorded()) == 2, "both listings recorded")
    poll(server.url)
    assert polls_replayed() == [True, True], server.log_text()[-2000:]
    before = recorded()
    clone = tmp_path / "clone"
    h.git("clone", "-q", f"{server.url}/r.git", str(clone))
    h.git("-C", str(clone), "commit", "-q", "--allow-empty", "-m", "polled")
    h.git("-C", str(clone), "push", "-q", "origin", "HEAD")
    pushed = h.out("rev-parse", "HEAD", cwd=str(clone))
    assert "resident=1" in [ln for ln in server.log_text().splitlines() if "service=receive-pack" in ln][-1]
    _wait(lambda: all(recorded().get(k) not in (None, ino) for k, ino in before.items()),
          "the push's worker to record both listings again", 10)
    got = poll(server.url)
    assert polls_replayed() == [True, True], server.log_text()[-2000:]
    assert all(pushed.encode() in answer for answer in got)
    assert got == poll(server.url, X_Fresh="1")          # a key of its own: the pipeline's answer now
    assert polls_replayed() == [False, False]
    stock = poll(cgi_server_factory(repo, "stock").url)
    assert d.norm_advertisement(got[0]) == d.norm_advertisement(stock[0]) and got[1] == stock[1]


def test_the_request_environment_is_the_whole_environment(repo, tmp_path):
    """The resident started from a request with GIT_HTTP_EXPORT_ALL; a later
    request without it is refused as stock refuses it (no
    git-daemon-export-ok), by the resident."""
    run = tmp_path / "run"
    _started(repo, run)
    env = _env(repo, run, ASPEN_N="e")
    del env["GIT_HTTP_EXPORT_ALL"]
    via = h.aspen(env)
    assert b"resident=1" in via.stderr
    assert via.status == 404
    d.check_like_stock(env, b"", via)


def test_killed_resident_means_in_process_then_a_new_one(repo, tmp_path):
    run = tmp_path / "run"
    pid = _started(repo, run)
    sock = Path(handoff.socket_path(str(run)))
    stale = sock.stat().st_ino
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: not _alive(pid), "the resident to die")
    after = h.aspen(_env(repo, run, ASPEN_N="k1"))
    assert after.status == 200 and b"resident=1" not in after.stderr
    # a new resident renames its socket over the dead one's once it listens
    _wait(lambda: sock.exists() and sock.stat().st_ino != stale, "a new resident")
    new = _pid(run)
    assert new != pid
    assert _alive(new)
    again = h.aspen(_env(repo, run, ASPEN_N="k2"))
    assert b"resident=1" in again.stderr and again.body == after.body
    d.check_like_stock(_env(repo, run, ASPEN_N="k2"), b"", again)


def test_a_worker_killed_mid_request_cuts_only_that_request(repo, tmp_path):
    """A push whose writer kills itself at a fault point (as the crash tests
    do): aspen-cgi ends without an answer, as the CGI program killed there
    would; the ref did not move; the next request is answered."""
    run = tmp_path / "run"
    pid = _started(repo, run)
    bare = repo / "r.git"
    before = h.refs_of(str(bare))
    clone = tmp_path / "c"
    h.git("clone", "-q", str(bare), str(clone))
    h.git("-C", str(clone), "commit", "-q", "--allow-empty", "-m", "doomed")
    new = h.out("rev-parse", "HEAD", cwd=str(clone)).strip()
    pack = subprocess.run(["git", "pack-objects", "--stdout", "--revs", "-q"], cwd=clone, check=True,
                          input=f"{new}\n^{before['refs/heads/main']}\n".encode(), capture_output=True).stdout
    cmd = f"{before['refs/heads/main']} {new} refs/heads/main\0report-status\n".encode()
    body = f"{len(cmd) + 4:04x}".encode() + cmd + b"0000" + pack
    env = _env(repo, run, REQUEST_METHOD="POST", PATH_INFO="/r.git/git-receive-pack", QUERY_STRING="",
               CONTENT_TYPE="application/x-git-receive-pack-request", CONTENT_LENGTH=str(len(body)),
               GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.receivepack", GIT_CONFIG_VALUE_0="true",
               ASPEN_FAULT="after-intake", ASPEN_N="f")
    proc = subprocess.run([h.ASPEN_CGI], env={**h.BASE_ENV, **env}, input=body, capture_output=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == b"", (proc.returncode, proc.stdout[:200], proc.stderr)
    assert b"ended before finishing" in proc.stderr
    assert h.refs_of(str(bare)) == before
    assert _alive(pid)
    after = h.aspen(_env(repo, run, ASPEN_N="f2"))
    assert b"resident=1" in after.stderr
    d.check_like_stock(_env(repo, run, ASPEN_N="f2"), b"", after)


def _private_install(tmp_path: Path) -> str:
    """aspen-cgi over a copy of the package (a venv of its own whose path file
    names the copy, then the real site-packages for the dependencies): its
    resident is its own (handoff.key), so changing the copy touches no other."""
    import aspen_cgi
    real = Path(aspen_cgi.__file__).parent
    pkg = tmp_path / "pkg"
    shutil.copytree(real, pkg / "aspen_cgi", ignore=shutil.ignore_patterns("__pycache__"))
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    packages = tmp_path / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    packages.mkdir(parents=True)
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (packages / "aspen-copy.pth").write_text(f"{pkg}\n{site}\n")
    os.symlink(Path(sys.executable).parent / "python3", bindir / "python3")
    script = bindir / "aspen-cgi"
    shutil.copy(real.parent / "bin" / "aspen-cgi", script)
    os.chmod(script, 0o755)
    return str(script)


def test_changed_code_means_in_process_and_the_resident_goes(repo, tmp_path):
    run = tmp_path / "run"
    program = _private_install(tmp_path)
    first = h.run_cgi(program, _env(repo, run, ASPEN_N="0"))
    assert first.status == 200 and b"resident=1" not in first.stderr
    pid = _wait(lambda: _pid(run), "the resident to listen")
    assert b"resident=1" in h.run_cgi(program, _env(repo, run, ASPEN_N="1")).stderr
    module = tmp_path / "pkg" / "aspen_cgi" / "resident.py"
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))     # an upgrade
    after = h.run_cgi(program, _env(repo, run, ASPEN_N="s"))
    assert after.status == 200 and b"resident=1" not in after.stderr
    _wait(lambda: not _alive(pid), "the resident to stop")


def test_a_socket_path_of_sun_paths_whole_size_works(repo):
    """A run directory whose socket path is 107 bytes, sun_path's most: the
    resident binds it (through a shorter temporary name) and answers."""
    base = tempfile.mkdtemp(prefix="aspen-resident-long-", dir="/tmp")
    try:
        name = f"resident-{os.getuid()}-{'0' * 16}.sock"
        run = Path(base) / ("r" * (107 - len(base) - 2 - len(name)))
        assert len(str(run / name).encode()) == 107
        _started(repo, run)
        res = h.aspen(_env(repo, run, ASPEN_N="long"))
        assert b"resident=1" in res.stderr
        d.check_like_stock(_env(repo, run, ASPEN_N="long"), b"", res)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_socket_path_longer_than_sun_path_is_said_in_the_log(repo, tmp_path):
    """One byte more: no resident can bind it; each request is answered in
    its own process, correctly, and says why in the error log."""
    base = tempfile.mkdtemp(prefix="aspen-resident-long-", dir="/tmp")
    try:
        name = f"resident-{os.getuid()}-{'0' * 16}.sock"
        run = Path(base) / ("r" * (108 - len(base) - 2 - len(name)))
        res = h.aspen(_env(repo, run))
        assert res.status == 200 and b"resident=1" not in res.stderr
        assert f"aspen: ASPEN_RUN_DIR {run} is too long for the resident's socket (108 bytes, at most 107)".encode() \
            in res.stderr, res.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_resident_goes_with_its_run_directory(repo, tmp_path):
    run = tmp_path / "run"
    pid = _started(repo, run)
    shutil.rmtree(run)          # its files and what else the run directory holds (poll files: polls/)
    _wait(lambda: not _alive(pid), "the resident to stop", timeout=10)


def test_the_resident_goes_when_idle(repo, tmp_path):
    run = tmp_path / "run"
    first = h.aspen(_env(repo, run, ASPEN_CGI_RESIDENT_IDLE="1"))
    assert first.status == 200
    pid = _wait(lambda: _pid(run), "the resident to listen")
    _wait(lambda: not _alive(pid), "the resident to stop when idle", timeout=15)
    assert not list(run.glob("resident-*.sock"))


def test_no_resident_when_switched_off(repo, tmp_path):
    run = tmp_path / "run"
    for i in range(2):
        assert b"resident=1" not in h.aspen(_env(repo, run, ASPEN_CGI_RESIDENT="0", ASPEN_N=str(i))).stderr
    time.sleep(0.5)
    assert not run.exists() or not list(run.glob("resident-*"))


def test_all_workers_busy_means_in_process(repo, tmp_path, cgi_server_factory):
    """With one worker, busy with a push whose pre-receive hook waits for a
    file, another request is answered in-process, not queued."""
    run = tmp_path / "run"
    _started(repo, run, ASPEN_CGI_RESIDENT_WORKERS="1")     # the resident's size is its starter's setting
    bare = repo / "r.git"
    gate = tmp_path / "gate"
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\ncat >/dev/null\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n")
    hook.chmod(0o755)
    clone = tmp_path / "c"
    h.git("clone", "-q", str(bare), str(clone))
    h.git("-C", str(clone), "commit", "-q", "--allow-empty", "-m", "held")
    server = cgi_server_factory(repo, program="aspen", ASPEN_RUN_DIR=str(run), ASPEN_ACCESS_LOG="1",
                                ASPEN_CGI_RESIDENT_WORKERS="1", GIT_CONFIG_COUNT="1",
                                GIT_CONFIG_KEY_0="http.receivepack", GIT_CONFIG_VALUE_0="true")
    push = subprocess.Popen(["git", "-C", str(clone), "push", "-q", f"{server.url}/r.git", "HEAD:refs/heads/held"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait(lambda: _hook_running(hook), "the push to reach its hook")
        other = h.aspen(_env(repo, run, ASPEN_CGI_RESIDENT_WORKERS="1", ASPEN_N="busy"))
        assert other.status == 200 and b"resident=1" not in other.stderr, other.stderr
    finally:
        gate.touch()
        assert push.wait(timeout=60) == 0, push.stderr.read()
    assert "service=receive-pack" in server.log_text() and "resident=1" in server.log_text()
    assert h.refs_of(str(bare))["refs/heads/held"] == h.out("rev-parse", "HEAD", cwd=str(clone)).strip()


def _hook_running(hook: Path) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if str(hook) in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                    return True
            except OSError:
                pass
    return False


@pytest.fixture
def open_run():
    """A run directory another user can reach (tmp_path's parents are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="aspen-resident-test-", dir="/tmp"))
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_another_users_socket_is_not_used(repo, open_run):
    """A socket at the resident's path that another user serves: aspen-cgi
    says so on the error log and answers in-process (it never sends that
    user a request)."""
    run = open_run
    path = handoff.socket_path(str(run))
    script = (f"import os, socket\nos.setgid(65534); os.setuid(65534)\n"
              f"s = socket.socket(socket.AF_UNIX); s.bind({path!r}); s.listen(4)\n"
              f"open({str(run / 'ready')!r}, 'w').close()\n"
              f"c, _ = s.accept(); data = c.recv(100)\n"
              f"open({str(run / 'got')!r}, 'wb').write(data)\n")
    fake = subprocess.Popen([sys.executable, "-c", script])
    try:
        _wait(lambda: (run / "ready").exists(), "the other user's socket")
        res = h.aspen(_env(repo, run, ASPEN_N="u"))
        assert res.status == 200 and b"resident=1" not in res.stderr
        assert b"is another user's; ignored" in res.stderr
        time.sleep(0.2)
        assert not (run / "got").exists() or (run / "got").read_bytes() == b""
    finally:
        fake.kill()
        fake.wait()


def test_the_resident_answers_no_other_user(repo, open_run):
    """Another user reaching the resident's socket (its mode opened by hand)
    gets the connection closed, nothing taken."""
    run = open_run
    pid = _started(repo, run)
    path = handoff.socket_path(str(run))
    os.chmod(path, 0o777)
    script = (f"import os, socket\nos.setgid(65534); os.setuid(65534)\n"
              f"s = socket.socket(socket.AF_UNIX); s.connect({path!r})\n"
              f"s.settimeout(10)\n"
              f"try:\n    s.sendall(b'1 0\\n' + b'x'); print(repr(s.recv(10)))\n"
              f"except (ConnectionResetError, BrokenPipeError):\n    print('reset')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() in ("b''", "reset"), (out.stdout, out.stderr)     # closed, unread: either
    assert _alive(pid) and b"resident=1" in h.aspen(_env(repo, run, ASPEN_N="o")).stderr

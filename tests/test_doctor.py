"""`aspen doctor` against deployments made wrong on purpose: each check says
what is wrong and how to fix it, in one line, and the exit status is 1 while
anything is; a correct deployment is `no problem found`, exit 0. The web
server's user is `nobody` (root checks as it); Apache's configuration and
its systemd unit are scratch copies the test writes."""

from __future__ import annotations

import http.server
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from . import harness as h
from .deploy_apache import world_dir
from .test_runas import need_root

pytestmark = pytest.mark.timeout(300)

ASPEN = str(Path(sys.executable).parent / "aspen")
NOBODY = pwd.getpwnam("nobody")


class Deployment:
    """A GIT_PROJECT_ROOT with one repository, an Apache configuration
    directory and a unit file, all the test's own."""

    def __init__(self, tmp: Path):
        self.root = world_dir(tmp / "git")
        self.repo = h.make_history(self.root / "repo.git", commits=3)
        self.apache = tmp / "apache2"
        for d in ("mods-enabled", "conf-enabled", "sites-enabled"):
            (self.apache / d).mkdir(parents=True)
        self.unit = tmp / "apache2.service"
        self.unit.write_text("[Service]\nType=forking\n")
        self.run_dir = world_dir(tmp / "run")
        os.chown(self.run_dir, NOBODY.pw_uid, NOBODY.pw_gid)
        self.env = {"GIT_PROJECT_ROOT": str(self.root), "ASPEN_RUN_DIR": str(self.run_dir)}

    def give_to_nobody(self) -> None:
        subprocess.run(["chown", "-R", f"{NOBODY.pw_uid}:{NOBODY.pw_gid}", str(self.repo)], check=True)

    def site(self, text: str) -> None:
        (self.apache / "sites-enabled" / "aspen.conf").write_text(text)

    def doctor(self, *args: str, env: dict | None = None) -> tuple[int, list[dict], str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("ASPEN_")}
        full.update(self.env)
        full.update(env or {})
        res = subprocess.run([ASPEN, "doctor", "--json", "--user", "nobody", "--apache-dir", str(self.apache),
                              "--unit", str(self.unit), *args], capture_output=True, text=True, env=full,
                             timeout=240)
        assert "Traceback" not in res.stderr, res.stderr
        return res.returncode, json.loads(res.stdout), res.stderr

    def fails(self, *args: str, env: dict | None = None) -> dict[str, str]:
        rc, findings, _ = self.doctor(*args, env=env)
        bad = {f["check"]: f["text"] for f in findings if f["level"] == "FAIL"}
        assert (rc == 1) == bool(bad), (rc, findings)
        return bad


@pytest.fixture
def deployment(tmp_path) -> Deployment:
    need_root()
    return Deployment(tmp_path)


def test_a_correct_deployment_has_no_problem(deployment):
    d = deployment
    d.give_to_nobody()
    res = subprocess.run([ASPEN, "import", "-q", str(d.repo)], capture_output=True, text=True, timeout=240,
                         env=dict(os.environ, ASPEN_PREWARM="off", **d.env))
    assert res.returncode == 0, res.stderr
    rc, findings, _ = d.doctor()
    assert rc == 0, findings
    texts = [f"{f['level']} {f['check']}: {f['text']}" for f in findings]
    assert f"ok repo: {d.repo}: readable and writable by nobody" in texts
    assert any(t.startswith(f"ok store: {d.repo}: version 1, equal to the refs on disk") for t in texts), texts
    assert f"note settings: ASPEN_RUN_DIR={d.run_dir} (from environment)" in texts
    plain = subprocess.run([ASPEN, "doctor", "--user", "nobody", "--apache-dir", str(d.apache), "--unit",
                            str(d.unit)], capture_output=True, text=True, env=dict(os.environ, **d.env), timeout=240)
    assert plain.returncode == 0 and plain.stdout.endswith("no problem found\n"), plain.stdout


def test_a_repository_the_server_cannot_write_or_git_distrusts(deployment):
    bad = deployment.fails()                   # the repository is root's, the server nobody
    repo = deployment.repo
    assert bad["write"].startswith(f"{repo}: nobody cannot write objects/ and refs/ (pushes fail): chown -R nobody")
    assert "dubious ownership" in bad["ownership"] and "safe.directory" in bad["ownership"]
    assert bad["state"].startswith(f"{repo}: nobody cannot make {repo}/aspen")


def test_state_left_by_another_user(deployment):
    d = deployment
    d.give_to_nobody()
    (d.repo / "aspen").mkdir()
    (d.repo / "aspen" / "cache").mkdir()         # as a root command once left it
    os.chown(d.repo / "aspen", NOBODY.pw_uid, NOBODY.pw_gid)
    bad = d.fails()
    assert set(bad) == {"state"}
    assert f"nobody cannot write {d.repo}/aspen/cache" in bad["state"]
    assert bad["state"].endswith(f"chown -R nobody {d.repo}/aspen")


def test_a_repository_the_server_cannot_read(deployment):
    d = deployment
    d.give_to_nobody()
    os.chmod(d.root, 0o700)
    bad = d.fails()
    assert set(bad) == {"read"} and bad["read"].startswith(f"{d.repo}: nobody cannot read it (clones fail)")


def test_cgi_configured_without_a_cgi_module(deployment):
    d = deployment
    d.give_to_nobody()
    d.site("ScriptAlias /git/ /opt/aspen/venv/bin/aspen-cgi/\n")
    assert d.fails()["apache"].startswith("aspen-cgi is configured but no CGI module is enabled")
    (d.apache / "mods-enabled" / "cgid.load").write_text("LoadModule cgid_module x\n")
    assert d.fails() == {}


def test_wsgi_configured_without_mod_wsgi(deployment):
    d = deployment
    d.give_to_nobody()
    d.site("WSGIScriptAlias /git /opt/aspen/venv/share/aspen/apache/aspen.wsgi\n")
    assert "libapache2-mod-wsgi-py3" in d.fails()["apache"]


def test_private_tmp_hides_the_run_directory(deployment):
    d = deployment
    d.give_to_nobody()
    d.unit.write_text("[Service]\nPrivateTmp=true\n")
    d.env.pop("ASPEN_RUN_DIR")
    bad = d.fails()
    assert set(bad) == {"run-dir"}
    assert f"PrivateTmp=true, so its /tmp/aspen-run-{NOBODY.pw_uid} is not the one this shell sees" in bad["run-dir"]
    run = Path(tempfile.mkdtemp(prefix="aspen-doctor-", dir="/run"))     # the fix: outside /tmp, in Apache's
    try:                                                                 # configuration
        os.chown(run, NOBODY.pw_uid, NOBODY.pw_gid)
        (d.apache / "mods-enabled" / "cgid.load").write_text("LoadModule cgid_module x\n")
        d.site(f"ScriptAlias /git/ /opt/aspen/venv/bin/aspen-cgi/\nSetEnv ASPEN_RUN_DIR {run}\n")
        rc, findings, _ = d.doctor()
    finally:
        shutil.rmtree(run)
    assert rc == 0, findings
    where = str(d.apache / "sites-enabled" / "aspen.conf") + ":2"
    assert {"level": "note", "check": "settings", "text": f"ASPEN_RUN_DIR={run} (from {where})"} in findings


def test_a_run_directory_the_server_cannot_write(deployment):
    d = deployment
    d.give_to_nobody()
    os.chown(d.run_dir, 0, 0)
    bad = d.fails()
    assert set(bad) == {"run-dir"} and bad["run-dir"].startswith(f"nobody cannot write {d.run_dir}")


def test_a_setting_that_does_not_parse(deployment):
    d = deployment
    d.give_to_nobody()
    bad = d.fails(env={"ASPEN_QUEUE": "many"})
    assert set(bad) == {"settings"} and "ASPEN_QUEUE" in bad["settings"]


def test_the_store_behind_the_disk_and_the_pack_backlog(deployment):
    d = deployment
    d.give_to_nobody()
    res = subprocess.run([ASPEN, "log", str(d.repo)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **d.env))
    assert res.returncode == 0, res.stderr
    h.git("--git-dir", str(d.repo), "update-ref", "refs/heads/moved", "HEAD")
    rc, findings, _ = d.doctor()
    assert rc == 0
    notes = {f["check"]: f["text"] for f in findings if f["level"] == "note"}
    assert notes["store"].startswith(f"{d.repo}: version 1, 1 refs changed on disk since (e.g. refs/heads/moved)")
    assert notes["packs"].startswith(f"{d.repo}: 1 versions wait for their packs")


def test_a_cluster_whose_database_and_pack_store_are_unreachable(deployment):
    d = deployment
    d.give_to_nobody()
    bad = d.fails(env={"ASPEN_REFSTORE_URL": f"postgresql://aspen@127.0.0.1:{h.free_port()}/aspen",
                       "ASPEN_PACK_STORE": str(d.root / "missing"), "ASPEN_CLUSTER": "c"})
    assert set(bad) == {"postgresql", "pack-store"}
    assert bad["postgresql"].startswith("ASPEN_REFSTORE_URL unreachable")
    assert bad["pack-store"].startswith(f"{d.root / 'missing'} is missing or not writable by nobody")


def test_url_that_is_not_a_smart_http_repository(deployment):
    d = deployment
    d.give_to_nobody()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        bad = d.fails("--url", f"http://127.0.0.1:{server.server_port}/git/repo.git")
    finally:
        server.shutdown()
    assert set(bad) == {"url"} and " 404 " in bad["url"]


def test_a_gunicorn_units_settings_and_user(deployment, tmp_path):
    """The unit's Environment= lines are the settings in force (said with the
    unit's line), its User= is the server's user; a unit run with
    PrivateTmp and the run directory under /tmp is a problem."""
    d = deployment
    d.give_to_nobody()
    unit = tmp_path / "aspen-gunicorn.service"
    unit.write_text(f"[Service]\nUser=nobody\nEnvironment=GIT_PROJECT_ROOT={d.root}\n"
                    f"Environment=ASPEN_RUN_DIR={d.run_dir}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASPEN_") and k != "GIT_PROJECT_ROOT"}
    res = subprocess.run([ASPEN, "doctor", "--json", "--apache-dir", str(d.apache), "--unit", str(unit)],
                         capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stdout
    findings = json.loads(res.stdout)
    assert {"level": "note", "check": "settings", "text": f"GIT_PROJECT_ROOT={d.root} (from {unit}:3)"} in findings
    assert {"level": "ok", "check": "repo", "text": f"{d.repo}: readable and writable by nobody"} in findings
    unit.write_text(f"[Service]\nUser=nobody\nPrivateTmp=yes\nEnvironment=GIT_PROJECT_ROOT={d.root}\n")
    res = subprocess.run([ASPEN, "doctor", "--json", "--apache-dir", str(d.apache), "--unit", str(unit)],
                         capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 1
    assert [f["check"] for f in json.loads(res.stdout) if f["level"] == "FAIL"] == ["run-dir"]


def test_a_run_directory_too_long_for_the_residents_socket(deployment, tmp_path):
    d = deployment
    d.give_to_nobody()
    long = world_dir(tmp_path / ("r" * 60) / ("u" * 40))
    os.chown(long, NOBODY.pw_uid, NOBODY.pw_gid)
    bad = d.fails(env={"ASPEN_RUN_DIR": str(long)})
    assert set(bad) == {"resident"} and "too long for the resident's socket" in bad["resident"]

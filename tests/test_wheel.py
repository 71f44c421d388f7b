"""What an operator installs: the wheel and the sdist `python -m build`
makes from a checkout. The wheel installs into a fresh venv of Debian's
python3 with everything Aspen needs at run time (the shipped Apache and nginx
files and `aspen.wsgi` in `<venv>/share/aspen/`), its version names the
commit it was built from, and the installed `aspen-cgi` answers as stock
does, with no checkout on its path."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from . import harness as h
from .differential import norm_advertisement

pytestmark = pytest.mark.timeout(600)

CHECKOUT = Path(__file__).resolve().parents[1]
SHARED = ["apache/aspen-cgi.conf", "apache/aspen-wsgi.conf", "apache/aspen.wsgi", "apache/side-by-side.conf",
          "nginx/aspen.conf", "nginx/aspen-cluster.conf", "nginx/aspen-offload.conf", "nginx/aspen-gunicorn.service"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "aspen"     # a copy: the build writes build/ and _version.py in it
    shutil.copytree(CHECKOUT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    res = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                         capture_output=True, text=True, timeout=500, cwd=str(src))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def test_the_version_names_the_commit(dist):
    wheel = _one(dist, "aspen_cgi-*.whl")
    head = h.out("rev-parse", "--short=7", "HEAD", cwd=str(CHECKOUT))
    version = wheel.name.split("-")[1]
    assert f"+g{head[:7]}" in version, (version, head)


def test_the_wheel_and_sdist_carry_what_an_operator_needs(dist):
    names = zipfile.ZipFile(_one(dist, "aspen_cgi-*.whl")).namelist()
    for f in SHARED:
        assert any(n.endswith("/data/share/aspen/" + f) for n in names), f
    assert any(n.endswith("/scripts/aspen-cgi") for n in names)
    assert "aspen_cgi/_version.py" in names
    assert not any(n.startswith("bench/results/") for n in names)
    sdist = tarfile.open(_one(dist, "aspen*cgi-*.tar.gz")).getnames()
    for f in [*SHARED, "bin/aspen-cgi", "README.md", "docs/settings.md", "setup.cfg"]:
        assert any(n.endswith("/" + f) for n in sdist), f
    assert not any("/bench/results/" in n for n in sdist)


def test_installed_from_the_wheel_it_serves_as_stock_does(dist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    wheel = _one(dist, "aspen_cgi-*.whl")
    res = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                         timeout=500)
    assert res.returncode == 0, res.stderr[-3000:]
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    version = subprocess.run([str(venv / "bin/aspen"), "--version"], capture_output=True, text=True, env=clean,
                             cwd="/", timeout=60)
    assert version.stdout.strip() == "aspen " + wheel.name.split("-")[1]
    for f in SHARED:
        assert (venv / "share/aspen" / f).is_file(), f
    where = subprocess.run([str(venv / "bin/python"), "-c", "import aspen_cgi; print(aspen_cgi.__file__)"],
                           capture_output=True, text=True, env=clean, cwd="/", timeout=60)
    assert where.stdout.startswith(str(venv)), where.stdout      # the wheel's, not the checkout's
    app = subprocess.run([str(venv / "bin/python"), "-c",
                          "import runpy; print(callable(runpy.run_path(__import__('sys').argv[1])['application']))",
                          str(venv / "share/aspen/apache/aspen.wsgi")],
                         capture_output=True, text=True, env=clean, cwd="/", timeout=60)
    assert app.stdout.strip() == "True", app.stderr

    repo = h.make_history(tmp_path / "repos" / "r.git", commits=3)
    env = {"GIT_PROJECT_ROOT": str(tmp_path / "repos"), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/r.git/info/refs", "QUERY_STRING": "service=git-upload-pack"}
    ours = h.run_cgi(str(venv / "bin/aspen-cgi"), env)
    theirs = h.stock(env)
    assert ours.status == theirs.status == 200
    assert norm_advertisement(ours.body) == norm_advertisement(theirs.body)
    assert repo.is_dir()

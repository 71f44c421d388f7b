"""How aspen-cgi starts (aspen_cgi/cgilauncher.py): pip installs it with a
/bin/sh first line that execs the venv's Python with -I -S; `aspen
install-cgi` (run by ./run setup) rewrites that line to start the same
interpreter directly with -IS. Both forms answer a request with the same
bytes; the rewrite refuses a file that is not aspen-cgi and leaves it as
it was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from aspen_cgi import cgilauncher

from .harness import ASPEN_CGI, BASE_ENV, make_history

SOURCE = Path(__file__).resolve().parent.parent / "bin" / "aspen-cgi"


def _venv_copy(tmp_path: Path) -> Path:
    """bin/aspen-cgi as pip installs it, beside a python3 that is this venv's, in a
    venv whose site-packages names this checkout (as ./run setup's path file does)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    packages = tmp_path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    packages.mkdir(parents=True)
    (packages / "aspen-checkout.pth").write_text(str(SOURCE.parent.parent) + "\n")
    os.symlink(Path(sys.executable).parent / "python3", bindir / "python3")
    script = bindir / "aspen-cgi"
    shutil.copy(SOURCE, script)
    os.chmod(script, 0o755)
    return script


def _advert(script: Path, root: Path) -> subprocess.CompletedProcess:
    env = {**BASE_ENV, "GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/r.git/info/refs", "QUERY_STRING": "service=git-upload-pack", "ASPEN_REFSTORE": "0"}
    return subprocess.run([str(script)], env=env, capture_output=True, timeout=60)


def test_the_sh_form_and_the_direct_form_answer_alike(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    make_history(root / "r.git", commits=3)
    script = _venv_copy(tmp_path)
    assert script.read_bytes().startswith(b"#!/bin/sh\n")
    by_sh = _advert(script, root)
    assert by_sh.returncode == 0 and b"# service=git-upload-pack" in by_sh.stdout, by_sh.stderr
    python = str(script.parent / "python3")
    assert cgilauncher.rewrite(str(script), python) is None
    assert script.read_bytes().split(b"\n", 1)[0] == f"#!{python} -IS".encode()
    assert os.access(script, os.X_OK)
    direct = _advert(script, root)
    assert direct.returncode == 0 and direct.stdout == by_sh.stdout, direct.stderr
    assert cgilauncher.rewrite(str(script), python) is None          # a second run changes nothing
    assert script.read_bytes().split(b"\n", 1)[1] == SOURCE.read_bytes().split(b"\n", 1)[1]


def test_the_direct_line_starts_python_isolated_and_without_site():
    first = Path(ASPEN_CGI).read_bytes().split(b"\n", 1)[0].decode()
    assert first in ("#!/bin/sh", f"#!{Path(ASPEN_CGI).parent / 'python3'} -IS")
    probe = subprocess.run([sys.executable, "-IS", "-c", "import sys; print(sys.flags.isolated, sys.flags.no_site)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == ["1", "1"]


def test_a_file_that_is_not_aspen_cgi_is_refused_and_left_alone(tmp_path):
    other = tmp_path / "other"
    other.write_bytes(b"#!/bin/sh\necho hello\n")
    why = cgilauncher.rewrite(str(other), sys.executable)
    assert why is not None and "not aspen-cgi" in why
    assert other.read_bytes() == b"#!/bin/sh\necho hello\n"
    script = _venv_copy(tmp_path)
    before = script.read_bytes()
    assert "too long" in cgilauncher.rewrite(str(script), "/" + "p" * 300)
    assert "no interpreter" in cgilauncher.rewrite(str(script), str(tmp_path / "missing" / "python3"))
    assert script.read_bytes() == before


def test_the_install_cgi_command(tmp_path):
    script = _venv_copy(tmp_path)
    aspen = [sys.executable, "-m", "aspen_cgi.cli", "install-cgi"]
    ok = subprocess.run([*aspen, str(script)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "starts" in ok.stdout, ok.stderr
    assert script.read_bytes().startswith(f"#!{script.parent / 'python3'} -IS\n".encode())
    bad = subprocess.run([*aspen, str(tmp_path / "bin" / "python3")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "aspen install-cgi:" in bad.stderr
    helped = subprocess.run([*aspen, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "/bin/sh" in helped.stdout

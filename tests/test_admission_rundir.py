"""A run directory this process cannot write in (another user's: the
ASPEN_RUN_DIR of the shell that started Apache, passed on to mod_wsgi's
www-data daemons) admits every request uncounted, as a missing one does.
Before, every place looked taken and each cold request got `503 queue full`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
import sys
from aspen_cgi import settings
from aspen_cgi.runtime import admission
lim = admission.capacity(settings.of({"ASPEN_RUN_DIR": sys.argv[1], "ASPEN_QUEUE": "4"}))
try:
    slot = admission.acquire(lim, sys.argv[2])
except admission.Overloaded as e:
    print("overloaded", e.why)
else:
    print("admitted", len(slot.held))
"""


def _probe(run_dir: Path, repo: Path, as_nobody: bool) -> str:
    def drop() -> None:
        os.setgid(65534)
        os.setuid(65534)
    res = subprocess.run([sys.executable, "-c", PROBE, str(run_dir), str(repo)], capture_output=True, text=True,
                         timeout=60, preexec_fn=drop if as_nobody else None,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_a_run_directory_it_cannot_write_admits_uncounted(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="aspen-rundir-", dir="/tmp"))    # every user may pass through
    os.chmod(base, 0o755)
    run_dir = base / "run"
    run_dir.mkdir(mode=0o755)
    if os.getuid() == 0:
        assert _probe(run_dir, tmp_path, as_nobody=True) == "admitted 0"
    else:
        os.chmod(run_dir, 0o555)
        assert _probe(run_dir, tmp_path, as_nobody=False) == "admitted 0"
        os.chmod(run_dir, 0o755)
    assert _probe(run_dir, tmp_path, as_nobody=False) == "admitted 2"      # its own: counted
    shutil.rmtree(base)

"""`aspen-bench polls` end to end at small sizes: nginx with the shipped
config, Aspen under the shipped unit's gunicorn, stock through fcgiwrap. It
must end with every answer byte-identical to its server's own, no stale
poll after a push, and polls answered from files on the file route only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import polls

from .harness import need_system

ROOT = Path(__file__).resolve().parent.parent


def test_shipped_files_filled_in(tmp_path):
    argv, env = polls.unit_command(str(tmp_path / "s.sock"), tmp_path, str(tmp_path / "p"), str(tmp_path / "l"))
    assert argv[0].endswith("/gunicorn") and f"unix:{tmp_path / 's.sock'}" in argv
    assert env["ASPEN_POLL_DIR"] == str(tmp_path / "p") and env["ASPEN_POLL_LOG"] == str(tmp_path / "l")
    block = polls.shipped_block("127.0.0.1:1", "unix:/x", "/h", "/p", "/l")
    assert "root                 /p/urls;" in block and "access_log /l aspen_poll" in block


def test_polls_command_small(tmp_path):
    need_system("nginx", polls.NGINX)
    need_system("fcgiwrap", polls.FCGIWRAP)
    out = tmp_path / "results"
    p = subprocess.run([sys.executable, "-m", "bench", "polls", "--requests", "60", "--reps", "1", "--pushes", "2",
                        "--preset", "tiny", "--out", str(out), "--no-plots"], cwd=str(ROOT), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    got = {(r["target"], r["params"].get("protocol")): r["metrics"] for r in rows if r.get("type") == "measurement"}
    for target in ("aspen-files", "aspen", "stock"):
        for protocol in ("v0", "v2"):
            m = got[(target, protocol)]
            assert m["failures"] == 0 and m["mismatches"] == 0, (target, protocol, m)
            assert m["req_per_s"] > 0
    assert got[("aspen-files", "v0")]["from_files"] > 0 and got[("aspen-files", "v2")]["from_files"] > 0
    push = got[("aspen-files", None)]
    assert push["pushes"] == 2 and push["stale_polls"] == 0 and push["from_files"] > 0

"""git's answer to a fetch with haves is computed with one delta-search
thread: with two, git splits (and steals) the work differently from run to
run, and the same request got 12,586 or 17,132 bytes. Observed through
uploadpack.packObjectsHook (protected configuration: GIT_CONFIG_GLOBAL),
which sees the configuration upload-pack passes to pack-objects."""

from __future__ import annotations

import os
from pathlib import Path

from . import differential as d
from . import harness as h


def _hooked(tmp_path: Path) -> tuple[dict, Path]:
    log = tmp_path / "pack-objects.log"
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\nprintf "%s\\n" "$GIT_CONFIG_PARAMETERS" >> {log}\nexec "$@"\n')
    hook.chmod(0o755)
    cfg = tmp_path / "global.gitconfig"
    cfg.write_text(f"[uploadpack]\n\tpackObjectsHook = {hook}\n")
    return {"GIT_CONFIG_GLOBAL": str(cfg), "ASPEN_VERSION_PACKS": "off"}, log      # git answers every fetch


def _fetch(root: Path, extra: dict, wants, haves) -> h.CgiResult:
    body = d.v0_request(wants, haves)
    res = h.aspen(d.post_env(root, "repo.git", "upload-pack", body, **extra), body)
    assert res.status == 200 and b"PACK" in res.body
    return res


def test_a_fetch_with_haves_gets_one_thread_and_a_clone_git_s_default(root, tmp_path):
    extra, log = _hooked(tmp_path)
    main, parent = h.out("rev-parse", "main", "main~1", cwd=str(root / "repo.git")).split()
    _fetch(root, extra, [main], [parent])
    assert "'pack.threads'='1'" in log.read_text()
    os.unlink(log)
    _fetch(root, extra, [main], [])
    assert "pack.threads" not in log.read_text()


def test_a_repository_s_own_pack_threads_is_kept(root, tmp_path):
    extra, log = _hooked(tmp_path)
    h.git("config", "pack.threads", "2", cwd=str(root / "repo.git"))
    main, parent = h.out("rev-parse", "main", "main~1", cwd=str(root / "repo.git")).split()
    _fetch(root, extra, [main], [parent])
    assert "pack.threads" not in log.read_text()

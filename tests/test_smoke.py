"""A first end-to-end check: a real clone over gunicorn, and one info/refs compared with stock."""

from __future__ import annotations

from . import harness as h


def test_clone_over_gunicorn_matches_server_refs(server, root, tmp_path):
    dest = tmp_path / "clone"
    h.git("clone", "-q", "--mirror", f"{server.url}/repo.git", str(dest))
    h.fsck_strict(str(dest))
    assert h.refs_of(str(dest)) == h.refs_of(str(root / "repo.git"))


def test_info_refs_status_and_type_match_stock(root):
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/repo.git/info/refs", "QUERY_STRING": "service=git-upload-pack"}
    s, a = h.stock(env), h.aspen(env)
    assert (s.status, s.header_names()) == (a.status, a.header_names())
    assert a.header("Content-Type") == "application/x-git-upload-pack-advertisement"

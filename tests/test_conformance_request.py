"""The checklist (docs/http-backend-checklist.md), request processing: method, path, routing, repository
discovery, export and getanyfile checks. Every test sends the same request to
stock `git http-backend`, to `aspen-cgi` and to the WSGI app and compares."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from . import differential as d
from . import harness as h
from .differential import NOCACHE, compare, env_for


def _empty_nocache(trio, status, reason):
    for r in (trio.stock, *trio.aspens):
        assert r.body == b""
    assert trio.stock.headers == [("Status", f"{status} {reason}")] + NOCACHE


def test_missing_request_method_is_500_with_nocache(root):
    env = env_for(root, "/repo.git/info/refs", REQUEST_METHOD=None)
    t = compare(env, status=500, stderr="fatal: No REQUEST_METHOD from server")
    _empty_nocache(t, 500, "Internal Server Error")


@pytest.mark.parametrize("path,query", [("/repo.git/info/refs", None), ("/repo.git/HEAD", None),
                                        ("/repo.git/info/refs", "service=git-upload-pack")])
def test_head_method_is_treated_as_get_and_still_has_a_body(root, path, query):
    t = compare(env_for(root, path, "HEAD", query), status=200,
                mode="advert" if query else "exact")
    assert t.stock.body and t.cgi.body and t.wsgi.body


def test_head_method_on_post_route_is_405_allow_post(root):
    t = compare(env_for(root, "/repo.git/git-upload-pack", "HEAD"), status=405)
    assert t.cgi.header("Allow") == "POST"


@pytest.mark.parametrize("method", ["get", "Get", "PUT", "OPTIONS"])
def test_method_comparison_is_case_sensitive(root, method):
    """Only HEAD is rewritten; `get` is not GET, so a known route answers 405."""
    compare(env_for(root, "/repo.git/info/refs", method), status=405)


@pytest.mark.parametrize("path_info", [None, ""])
def test_project_root_with_empty_or_unset_path_info_is_500(root, path_info):
    t = compare(env_for(root, "/x", PATH_INFO=path_info), status=500,
                stderr="fatal: GIT_PROJECT_ROOT is set but PATH_INFO is not")
    _empty_nocache(t, 500, "Internal Server Error")


ALIASED = ["//repo.git/info/refs", "/repo.git//info/refs", "/./repo.git/HEAD", "/repo.git/./HEAD",
           "/x/../repo.git/HEAD", "/repo.git/objects/..", "/repo.git/.", "/repo.git/..", "/.", "/..",
           "repo.git/HEAD", "x/repo.git/HEAD", "/repo.git/.//HEAD", "/../nope/HEAD"]


@pytest.mark.parametrize("path", ALIASED)
def test_project_root_mode_rejects_aliased_paths_with_500(root, path):
    t = compare(env_for(root, path), status=500, stderr=f"fatal: '{path}': aliased")
    _empty_nocache(t, 500, "Internal Server Error")


def test_tilde_path_is_not_aliased(root):
    """A PATH_INFO starting with `~` passes the alias check (and then fails as not a repository)."""
    compare(env_for(root, "~nosuchuser/repo.git/HEAD"), status=404)


def test_three_dot_segments_allowed_and_path_translated_not_alias_checked(root):
    (root / "...").mkdir()
    h.git("clone", "-q", "--bare", str(root / "repo.git"), str(root / "..." / "r.git"))
    t = compare(env_for(root, "/.../r.git/HEAD"), status=200)
    assert t.stock.body.startswith(b"ref: refs/heads/")
    compare(env_for(root, "/..../r.git/HEAD"), status=404, stderr="Not a git repository")
    env = {"REQUEST_METHOD": "GET", "GIT_HTTP_EXPORT_ALL": "1", "SERVER_PROTOCOL": "HTTP/1.1",
           "PATH_TRANSLATED": f"{root}/x/../repo.git/./info/refs"}
    (root / "x").mkdir()
    t = compare(env, status=200)
    assert b"refs/heads/main" in t.cgi.body


def test_neither_project_root_nor_path_translated_is_500(root):
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/repo.git/HEAD", "SERVER_PROTOCOL": "HTTP/1.1"}
    t = compare(env, status=500, stderr="fatal: No GIT_PROJECT_ROOT or PATH_TRANSLATED from server")
    _empty_nocache(t, 500, "Internal Server Error")
    env["GIT_PROJECT_ROOT"] = ""
    env["PATH_TRANSLATED"] = ""
    compare(env, status=500, stderr="fatal: No GIT_PROJECT_ROOT or PATH_TRANSLATED from server")


def test_empty_project_root_falls_back_to_path_translated(root):
    env = {"REQUEST_METHOD": "GET", "GIT_PROJECT_ROOT": "", "PATH_INFO": "//bogus",
           "PATH_TRANSLATED": f"{root}/repo.git/HEAD", "GIT_HTTP_EXPORT_ALL": "1"}
    compare(env, status=200)


@pytest.mark.parametrize("suffix", ["", "/", "//"])
def test_root_without_trailing_slash_is_joined_with_one_slash(root, suffix):
    r = str(root) + suffix
    compare(env_for(r, "/repo.git/HEAD", GIT_PROJECT_ROOT=r), status=200)
    compare(env_for(r, "/repo.git/nope", GIT_PROJECT_ROOT=r), status=404,
            stderr=f"Request not supported: '{r if suffix else r + '/'}repo.git/nope'")


ROUTING = [
    ("/repo.git/info/refs/x", 404, "Request not supported"),          # anchored at the end
    ("/repo.git/info/refs/HEAD", 404, "Not a git repository"),         # /HEAD matched, dir is .../info/refs
    ("/repo.git/HEAD/info/refs", 500, "fatal: invalid gitfile format: "),  # dir .../HEAD is a file: gitfile
    ("/repo.git/git-upload-pack/info/refs", 404, "Not a git repository"),
    ("/repo.git/head", 404, "Request not supported"),                 # case-sensitive
    ("/repo.git/INFO/refs", 404, "Request not supported"),
    ("/repo.git/objects/AB/" + "c" * 38, 404, "Request not supported"),  # uppercase hex
    ("/repo.git/objects/ab/" + "C" * 38, 404, "Request not supported"),
    ("/repo.git/objects/pack/pack-" + "A" * 40 + ".pack", 404, "Request not supported"),
    ("/repo.git/objects/ab/" + "c" * 37, 404, "Request not supported"),
    ("/repo.git/objects/ab/" + "c" * 39, 404, "Request not supported"),
    ("/repo.git/objects/pack/pack-" + "a" * 41 + ".pack", 404, "Request not supported"),
    ("/repo.git/objects/pack/pack-" + "a" * 40 + ".pack/", 404, "Request not supported"),
    ("/repo.git/HEAD/", 404, "Request not supported"),                # trailing slash
    ("/repo.git/xinfo/refs", 404, "Request not supported"),
    ("/repo.git/objects/info/packs", 200, None),
    ("/repo.git/objects/info/alternates", 404, "Cannot open 'objects/info/alternates'"),
    ("/HEAD", 404, "Not a git repository"),
]


@pytest.mark.parametrize("path,status,message", ROUTING)
def test_route_regexes_match_full_path_anchored_at_end_first_match_case_sensitive(root, path, status, message):
    compare(env_for(root, path), status=status, stderr=message)


def test_route_matching_newline_in_path_is_not_end(root):
    """POSIX `$` matches only at the very end: a path with a newline after HEAD is no route."""
    compare(env_for(root, "/repo.git/HEAD\nx"), status=404, stderr="Request not supported")


def test_pack_names_40_and_64_hex_and_loose_objects_2_38_and_2_62_are_routed(root):
    repo = root / "repo.git"
    for name in ("objects/pack/pack-" + "a" * 40 + ".pack", "objects/pack/pack-" + "b" * 64 + ".pack",
                 "objects/pack/pack-" + "c" * 40 + ".idx", "objects/pack/pack-" + "d" * 64 + ".idx",
                 "objects/ab/" + "e" * 38, "objects/ab/" + "f" * 62):
        compare(env_for(root, f"/repo.git/{name}"), status=404, stderr=f"Cannot open '{name}'")
    for name in ("objects/pack/pack-" + "a" * 63 + ".pack", "objects/ab/" + "f" * 61,
                 "objects/pack/pack-" + "a" * 40 + ".keep"):
        compare(env_for(root, f"/repo.git/{name}"), status=404, stderr="Request not supported")
    # existing files of both lengths are served
    (repo / "objects" / "ab").mkdir(exist_ok=True)
    (repo / "objects" / "ab" / ("1" * 62)).write_bytes(b"x" * 10)
    (repo / "objects" / "pack" / ("pack-" + "2" * 64 + ".idx")).write_bytes(b"y" * 7)
    t = compare(env_for(root, "/repo.git/objects/ab/" + "1" * 62), status=200)
    assert t.cgi.body == b"x" * 10
    t = compare(env_for(root, "/repo.git/objects/pack/pack-" + "2" * 64 + ".idx"), status=200)
    assert t.cgi.body == b"y" * 7


def test_unknown_path_is_404_nocache_empty_body_with_request_not_supported(root):
    t = compare(env_for(root, "/repo.git/nope"), status=404,
                stderr=f"Request not supported: '{root}/repo.git/nope'")
    _empty_nocache(t, 404, "Not Found")
    # stock writes the message without a trailing newline; Aspen may add one, nothing more
    assert t.stock.stderr == f"Request not supported: '{root}/repo.git/nope'".encode()
    assert t.cgi.stderr.rstrip(b"\n") == t.stock.stderr


@pytest.mark.parametrize("proto,status", [("HTTP/1.1", 405), ("HTTP/1.0", 400), ("HTTP/2.0", 400),
                                          ("HTTP/2", 400), ("http/1.1", 400), ("HTTP/1.1 ", 400)])
@pytest.mark.parametrize("path,method,allow", [("/repo.git/info/refs", "POST", "GET, HEAD"),
                                               ("/repo.git/HEAD", "PUT", "GET, HEAD"),
                                               ("/repo.git/objects/info/packs", "DELETE", "GET, HEAD"),
                                               ("/repo.git/git-upload-pack", "GET", "POST"),
                                               ("/repo.git/git-receive-pack", "GET", "POST")])
def test_wrong_method_is_405_with_allow_on_http11_else_400(root, proto, status, path, method, allow):
    t = compare(env_for(root, path, method, SERVER_PROTOCOL=proto), status=status)
    reason = "Method Not Allowed" if status == 405 else "Bad Request"
    extra = [("Allow", allow)] if status == 405 else []
    assert t.stock.headers == [("Status", f"{status} {reason}")] + extra + NOCACHE
    for r in (t.stock, *t.aspens):
        assert r.body == b""


def test_wrong_method_without_server_protocol_is_400(root):
    """WSGI servers always set SERVER_PROTOCOL, so only the CGI can be asked without one."""
    t = compare(env_for(root, "/repo.git/info/refs", "POST", SERVER_PROTOCOL=None), status=400, with_wsgi=False)
    assert t.cgi.header("Allow") is None


@pytest.mark.parametrize("path,method", [("/nonexistent/git-upload-pack", "GET"),
                                         ("/nonexistent/info/refs", "POST"),
                                         ("/repo.git/git-receive-pack", "GET"),
                                         ("/repo.git/git-upload-pack", "GET")])
def test_method_check_happens_before_repository_export_and_service_checks(root, path, method):
    h.git("config", "http.uploadpack", "false", cwd=str(root / "repo.git"))
    h.git("config", "http.getanyfile", "false", cwd=str(root / "repo.git"))
    compare(env_for(root, path, method), status=405)
    compare(env_for(root, path, method, GIT_HTTP_EXPORT_ALL=None), status=405)


@pytest.mark.parametrize("path,dirpart", [("/nope.git/info/refs", "nope.git"), ("/nope/HEAD", "nope"),
                                          ("/a/b/c/git-upload-pack", "a/b/c")])
def test_not_a_repository_is_404_with_message(root, path, dirpart):
    method = "POST" if path.endswith("pack") else "GET"
    env = env_for(root, path, method, CONTENT_TYPE="application/x-git-upload-pack-request")
    t = compare(env, status=404, stderr=f"Not a git repository: '{root}/{dirpart}'")
    _empty_nocache(t, 404, "Not Found")


def test_plain_directory_is_not_a_repository(root):
    (root / "plain" / "objects").mkdir(parents=True)
    (root / "plain" / "refs").mkdir()
    compare(env_for(root, "/plain/HEAD"), status=404, stderr=f"Not a git repository: '{root}/plain'")


def test_dwim_suffixes_tried_in_order_and_trailing_slashes_stripped(root):
    base = root / "repo.git"
    # `/repo` serves repo.git
    t = compare(env_for(root, "/repo/info/refs"), status=200)
    assert b"refs/heads/main" in t.cgi.body
    # a non-bare `work` serves work/.git
    h.git("clone", "-q", str(base), str(root / "work"))
    compare(env_for(root, "/work/info/refs"), status=200)
    # `x` with both x/.git and x.git: /.git wins
    h.git("clone", "-q", str(base), str(root / "both"))
    h.git("init", "-q", "--bare", str(root / "both.git"))
    t = compare(env_for(root, "/both/info/refs"), status=200)
    assert b"refs/remotes/origin/main" in t.cgi.body
    # `y` where y is not a repo but y.git/.git is
    (root / "y.git").mkdir()
    h.git("clone", "-q", str(base), str(root / "y.git" / "inner"))
    shutil.move(str(root / "y.git" / "inner" / ".git"), str(root / "y.git" / ".git"))
    compare(env_for(root, "/y/info/refs"), status=200)
    # the suffix appears in messages about the found repository
    os.remove(root / "work" / ".git" / "HEAD")
    compare(env_for(root, "/work/info/refs"), status=404, stderr=f"Not a git repository: '{root}/work'")
    # trailing slashes (PATH_TRANSLATED mode: no alias check) are stripped
    env = {"REQUEST_METHOD": "GET", "GIT_HTTP_EXPORT_ALL": "1", "PATH_TRANSLATED": f"{base}///info/refs"}
    compare(env, status=200)
    env = {"REQUEST_METHOD": "GET", "PATH_TRANSLATED": f"{root}/repo///info/refs"}
    compare(env, status=404, stderr=f"Repository not exported: '{root}/repo//'")


def test_gitfile_is_followed(root):
    (root / "linked").mkdir()
    (root / "linked" / ".git").write_text(f"gitdir: {root}/repo.git\n")
    t = compare(env_for(root, "/linked/info/refs"), status=200)
    assert b"refs/heads/main" in t.cgi.body
    (root / "rel.git").write_text("gitdir: repo.git\n")
    compare(env_for(root, "/rel/info/refs"), status=200)
    compare(env_for(root, "/rel.git/HEAD"), status=200)
    (root / "broken.git").write_text("gitdir: nowhere\n")
    compare(env_for(root, "/broken/HEAD"), status=500, stderr=f"fatal: not a git repository: {root}/nowhere")
    (root / "junk.git").write_text("junk\n")
    compare(env_for(root, "/junk/HEAD"), status=500, stderr=f"fatal: invalid gitfile format: {root}/junk.git")
    (root / "nopath.git").write_text("gitdir: \n")
    compare(env_for(root, "/nopath/HEAD"), status=500, stderr=f"fatal: no path in gitfile: {root}/nopath.git")


def test_repository_with_dubious_ownership_is_500_unless_safe_directory(root, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    repo = root / "repo.git"
    for dirpath, dirnames, filenames in os.walk(repo):
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), 4242, 4242)
    os.lchown(repo, 4242, 4242)
    env = env_for(root, "/repo.git/info/refs", HOME=str(home))
    t = compare(env, status=500, stderr=f"fatal: detected dubious ownership in repository at '{repo}'")
    _empty_nocache(t, 500, "Internal Server Error")
    compare(env_for(root, "/repo.git/info/refs", "GET", "service=git-upload-pack", HOME=str(home)), status=500)
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {repo}\n")
    compare(env, status=200)
    (home / ".gitconfig").write_text("[safe]\n\tdirectory = *\n")
    compare(env, status=200)
    # safe.directory in the repository's own config does not count
    (home / ".gitconfig").write_text("")
    h.git("config", "-f", str(repo / "config"), "safe.directory", "*")
    compare(env, status=500)


@pytest.mark.parametrize("path,query", [("/repo.git/info/refs", None), ("/repo.git/HEAD", None),
                                        ("/repo.git/info/refs", "service=git-upload-pack"),
                                        ("/repo.git/objects/info/packs", None)])
def test_not_exported_is_404_unless_export_ok_or_export_all_even_empty(root, path, query):
    t = compare(env_for(root, path, "GET", query, GIT_HTTP_EXPORT_ALL=None), status=404,
                stderr=f"Repository not exported: '{root}/repo.git'")
    _empty_nocache(t, 404, "Not Found")
    compare(env_for(root, path, "GET", query, GIT_HTTP_EXPORT_ALL=""), status=200, mode="advert" if query else "exact")
    (root / "repo.git" / "git-daemon-export-ok").write_text("")
    compare(env_for(root, path, "GET", query, GIT_HTTP_EXPORT_ALL=None), status=200,
            mode="advert" if query else "exact")


def test_not_exported_message_names_the_requested_path_not_the_dwim_one(root):
    compare(env_for(root, "/repo/HEAD", GIT_HTTP_EXPORT_ALL=None), status=404,
            stderr=f"Repository not exported: '{root}/repo'")


def _loose_object(repo: Path) -> str:
    p = h.git("hash-object", "-w", "--stdin", cwd=str(repo), input=b"loose object\n")
    return p.stdout.decode().strip()


def _pack_name(repo: Path) -> str:
    if not list((repo / "objects" / "pack").glob("pack-*.pack")):
        h.git("repack", "-q", "-d", cwd=str(repo))
    return sorted(p.name for p in (repo / "objects" / "pack").glob("pack-*.pack"))[0][:-5]


def test_getanyfile_false_is_403_on_dumb_routes_and_smart_unaffected(root):
    repo = root / "repo.git"
    oid = _loose_object(repo)
    pack = _pack_name(repo)
    (repo / "objects" / "info").mkdir(exist_ok=True)
    (repo / "objects" / "info" / "alternates").write_text("")
    (repo / "objects" / "info" / "http-alternates").write_text("")
    h.git("config", "http.getanyfile", "false", cwd=str(repo))
    dumb = ["/repo.git/HEAD", "/repo.git/info/refs", "/repo.git/objects/info/packs",
            "/repo.git/objects/info/alternates", "/repo.git/objects/info/http-alternates",
            f"/repo.git/objects/{oid[:2]}/{oid[2:]}", f"/repo.git/objects/pack/{pack}.pack",
            f"/repo.git/objects/pack/{pack}.idx", "/repo.git/objects/ab/" + "c" * 38]
    for path in dumb:
        t = compare(env_for(root, path), status=403, stderr="Unsupported service: getanyfile")
        for r in (t.stock, *t.aspens):
            assert r.body == b""
    compare(env_for(root, "/repo.git/info/refs", "GET", "service=git-upload-pack"), status=200, mode="advert")
    head = h.out("rev-parse", "main", cwd=str(repo))
    body = d.v0_request([head])
    compare(d.post_env(root, "repo.git", "upload-pack", body), body, status=200, mode="pack", repo=str(repo))
    for value in ("0", "no", "off", "False"):
        h.git("config", "http.getanyfile", value, cwd=str(repo))
        compare(env_for(root, "/repo.git/HEAD"), status=403)
    h.git("config", "http.getanyfile", "yes", cwd=str(repo))
    compare(env_for(root, "/repo.git/HEAD"), status=200)

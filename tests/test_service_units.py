"""Pure logic of the request's composition, tested without a server.

Covers service.py's RequestInfo.of(), protocol_version() and child_env()
(stock's run_service() environment), ServiceRefused's fields, gitexec's
GitEnv.without() and child_env(), and the route table (http/routes.py)
against backend.HANDLERS. Each of these only reads a mapping or a path and
returns a value, so a plain dict stands in for the CGI environment: no
repository, no process, no socket. child_env() is called with
with_exec_path=False (or a given GIT_EXEC_PATH), and a tripwire on
service._exec_path proves it starts no git.
"""

from __future__ import annotations

import os

import pytest

from aspen_cgi import service
from aspen_cgi.git import gitexec
from aspen_cgi.git.gitexec import GitEnv
from aspen_cgi.http import backend, routes
from aspen_cgi.service import RequestInfo, ServiceRefused, protocol_version

OID1 = "ab" + "c" * 38
OID256 = "d" * 64


@pytest.fixture
def no_git(monkeypatch):
    """Fails the test if child_env() asks git for its exec path."""
    def boom():
        raise AssertionError("child_env started git")
    monkeypatch.setattr(service, "_exec_path", boom)


# --- RequestInfo.of / protocol_version ---------------------------------------

def test_request_info_reads_the_cgi_variables():
    env = {"REMOTE_USER": "alice", "REMOTE_ADDR": "192.0.2.7", "GIT_NAMESPACE": "team/a",
           "GIT_PROTOCOL": "version=2"}
    assert RequestInfo.of(env) == RequestInfo("alice", "192.0.2.7", "team/a", 2)


def test_request_info_empty_values_are_none_and_protocol_defaults_to_0():
    assert RequestInfo.of({}) == RequestInfo(None, None, None, 0)
    env = {"REMOTE_USER": "", "REMOTE_ADDR": "", "GIT_NAMESPACE": "", "GIT_PROTOCOL": ""}
    assert RequestInfo.of(env) == RequestInfo(None, None, None, 0)


def test_request_info_given_protocol_overrides_the_environment():
    assert RequestInfo.of({"GIT_PROTOCOL": "version=2"}, 0).protocol == 0
    assert RequestInfo.of({}, 2).protocol == 2


def test_request_info_reads_git_protocol_not_the_http_header():
    # backend.py hands it the child environment, where child_env() copied the header
    assert RequestInfo.of({"HTTP_GIT_PROTOCOL": "version=2"}).protocol == 0


@pytest.mark.parametrize("value, version", [
    (None, 0),
    ("", 0),
    ("version=1", 1),
    ("version=2", 2),
    ("version=2:foo", 2),
    ("foo=bar:version=1", 1),
    ("version=1:version=2", 2),
    ("version=2:version=1", 2),     # the highest, not the last
    ("version=3", 0),               # unknown versions are ignored
    ("version=3:version=1", 1),
    ("version=02", 0),
    ("Version=2", 0),
    (" version=2", 0),
    ("version=", 0),
])
def test_protocol_version_takes_the_highest_known_version(value, version):
    assert protocol_version(value) == version
    assert RequestInfo.of({} if value is None else {"GIT_PROTOCOL": value}).protocol == version


# --- service.child_env -------------------------------------------------------

def test_child_env_sets_git_dir_and_returns_a_git_env(no_git):
    given = {"PATH": "/usr/bin", "REMOTE_USER": "alice", "REMOTE_ADDR": "192.0.2.7"}
    out = service.child_env(given, "/srv/repo.git", with_exec_path=False)
    assert type(out) is GitEnv
    assert out["GIT_DIR"] == "/srv/repo.git"
    assert out["PATH"] == "/usr/bin"
    assert "GIT_EXEC_PATH" not in out
    assert given == {"PATH": "/usr/bin", "REMOTE_USER": "alice", "REMOTE_ADDR": "192.0.2.7"}   # not modified


@pytest.mark.parametrize("env, name, email", [
    ({"REMOTE_USER": "alice", "REMOTE_ADDR": "192.0.2.7"}, "alice", "alice@http.192.0.2.7"),
    ({"REMOTE_ADDR": "192.0.2.7"}, "anonymous", "anonymous@http.192.0.2.7"),
    ({"REMOTE_USER": "alice"}, "alice", "alice@http.(none)"),
    ({}, "anonymous", "anonymous@http.(none)"),
    ({"REMOTE_USER": "", "REMOTE_ADDR": ""}, "anonymous", "anonymous@http.(none)"),   # empty is unset, as stock
])
def test_child_env_derives_the_committer_as_stock(no_git, env, name, email):
    out = service.child_env(env, "/r.git", with_exec_path=False)
    assert (out["GIT_COMMITTER_NAME"], out["GIT_COMMITTER_EMAIL"]) == (name, email)


def test_child_env_keeps_a_given_committer(no_git):
    env = {"REMOTE_USER": "alice", "GIT_COMMITTER_NAME": "Bob", "GIT_COMMITTER_EMAIL": ""}
    out = service.child_env(env, "/r.git", with_exec_path=False)
    # stock tests getenv(): a variable set, even empty, is kept
    assert (out["GIT_COMMITTER_NAME"], out["GIT_COMMITTER_EMAIL"]) == ("Bob", "")
    out = service.child_env({"REMOTE_USER": "alice", "GIT_COMMITTER_EMAIL": "b@x"}, "/r.git", with_exec_path=False)
    assert (out["GIT_COMMITTER_NAME"], out["GIT_COMMITTER_EMAIL"]) == ("alice", "b@x")
    out = service.child_env({"REMOTE_USER": "alice", "GIT_COMMITTER_NAME": ""}, "/r.git", with_exec_path=False)
    assert (out["GIT_COMMITTER_NAME"], out["GIT_COMMITTER_EMAIL"]) == ("", "alice@http.(none)")


def test_child_env_copies_the_protocol_header_unless_git_protocol_is_set(no_git):
    out = service.child_env({"HTTP_GIT_PROTOCOL": "version=2"}, "/r.git", with_exec_path=False)
    assert out["GIT_PROTOCOL"] == "version=2"
    assert RequestInfo.of(out).protocol == 2
    out = service.child_env({"HTTP_GIT_PROTOCOL": "version=2", "GIT_PROTOCOL": "version=1"}, "/r.git",
                            with_exec_path=False)
    assert out["GIT_PROTOCOL"] == "version=1"
    assert "GIT_PROTOCOL" not in service.child_env({}, "/r.git", with_exec_path=False)


def test_child_env_puts_a_given_exec_path_first_on_path(no_git):
    out = service.child_env({"GIT_EXEC_PATH": "/opt/git/libexec", "PATH": "/usr/bin:/bin"}, "/r.git")
    assert out["PATH"] == "/opt/git/libexec:/usr/bin:/bin"
    out = service.child_env({"GIT_EXEC_PATH": "/opt/git/libexec", "PATH": "/opt/git/libexec:/bin"}, "/r.git")
    assert out["PATH"] == "/opt/git/libexec:/bin"         # already first: not doubled
    out = service.child_env({"GIT_EXEC_PATH": "/opt/git/libexec"}, "/r.git")
    assert out["PATH"] == "/opt/git/libexec"              # no PATH: no trailing ':'


# --- ServiceRefused -----------------------------------------------------------

def test_service_refused_fields():
    e = ServiceRefused(403, "Forbidden", "receive-pack not enabled", [("X-A", "1")], b"no\n")
    assert (e.status, e.reason, e.log, e.extra, e.body) == \
        (403, "Forbidden", "receive-pack not enabled", [("X-A", "1")], b"no\n")
    assert str(e) == "receive-pack not enabled"
    d = ServiceRefused(400, "Bad Request")
    assert (d.log, d.extra, d.body, str(d)) == ("", [], b"", "Bad Request")
    assert d.extra is not ServiceRefused(400, "Bad Request").extra   # no shared default list


# --- gitexec.GitEnv / gitexec.child_env ---------------------------------------

def test_git_env_without_returns_a_copy_less_the_names():
    env = GitEnv({"GIT_DIR": "/r.git", "GIT_NAMESPACE": "a", "PATH": "/bin"})
    less = env.without("GIT_DIR", "GIT_NAMESPACE", "NOT_THERE")
    assert type(less) is GitEnv
    assert less == {"PATH": "/bin"}
    assert env == {"GIT_DIR": "/r.git", "GIT_NAMESPACE": "a", "PATH": "/bin"}
    assert env.without() == env and env.without() is not env


def test_gitexec_child_env_copies_base_and_adds_extra():
    base = {"PATH": "/bin", "GIT_DIR": "/r.git"}
    out = gitexec.child_env(base, GIT_DIR=".", GIT_SHALLOW_FILE="/tmp/s")
    assert type(out) is GitEnv
    assert out == {"PATH": "/bin", "GIT_DIR": ".", "GIT_SHALLOW_FILE": "/tmp/s"}
    assert base == {"PATH": "/bin", "GIT_DIR": "/r.git"}


def test_gitexec_child_env_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv("ASPEN_UNIT_MARKER", "here")
    out = gitexec.child_env(GIT_DIR=".")
    assert out["ASPEN_UNIT_MARKER"] == "here" and out["GIT_DIR"] == "."
    out["ASPEN_UNIT_MARKER"] = "changed"
    assert os.environ["ASPEN_UNIT_MARKER"] == "here"      # a copy, not os.environ itself


# --- the route table -----------------------------------------------------------

def test_every_route_names_a_handler_and_every_handler_is_routed():
    named = {r.handler for r in routes.ROUTES}
    assert named <= set(backend.HANDLERS), named - set(backend.HANDLERS)
    assert set(backend.HANDLERS) <= named, set(backend.HANDLERS) - named
    assert all(callable(h) for h in backend.HANDLERS.values())
    assert {r.method for r in routes.ROUTES} <= set(routes.ALLOW)


@pytest.mark.parametrize("path, method, handler, repo_dir, arg, content_type", [
    ("/repo.git/HEAD", "GET", "head", "/repo.git", "HEAD", ""),
    ("/a/b/repo.git/info/refs", "GET", "info_refs", "/a/b/repo.git", "info/refs", ""),
    ("/repo.git/objects/info/packs", "GET", "info_packs", "/repo.git", "objects/info/packs", ""),
    ("/repo.git/objects/info/http-alternates", "GET", "text_file", "/repo.git", "objects/info/http-alternates", ""),
    (f"/repo.git/objects/{OID1[:2]}/{OID1[2:]}", "GET", "file", "/repo.git", f"objects/{OID1[:2]}/{OID1[2:]}",
     "application/x-git-loose-object"),
    (f"/repo.git/objects/pack/pack-{OID256}.pack", "GET", "file", "/repo.git", f"objects/pack/pack-{OID256}.pack",
     "application/x-git-packed-objects"),
    (f"/repo.git/objects/pack/pack-{OID1}.idx", "GET", "file", "/repo.git", f"objects/pack/pack-{OID1}.idx",
     "application/x-git-packed-objects-toc"),
    ("/repo.git/git-upload-pack", "POST", "service", "/repo.git", "git-upload-pack", ""),
    ("/repo.git/git-receive-pack", "POST", "service", "/repo.git", "git-receive-pack", ""),
    ("/HEAD", "GET", "head", "", "HEAD", ""),
    ("/x/HEAD/info/refs", "GET", "info_refs", "/x/HEAD", "info/refs", ""),     # anchored at the end
])
def test_match_routes_a_path(path, method, handler, repo_dir, arg, content_type):
    m = routes.match(path)
    assert m is not None
    assert (m.route.method, m.route.handler, m.repo_dir, m.arg, m.route.content_type) == \
        (method, handler, repo_dir, arg, content_type)


@pytest.mark.parametrize("path", [
    "/repo.git",
    "/repo.git/",
    "/repo.git/HEAD/",
    "/repo.git/info/refs/x",
    "/repo.git/objects/ab/" + "c" * 37,                         # too short
    "/repo.git/objects/AB/" + "C" * 38,                         # upper-case hex
    "/repo.git/objects/pack/pack-" + "e" * 50 + ".pack",        # neither sha1 nor sha256
    "/repo.git/objects/pack/pack-" + OID1 + ".keep",
    "/repo.git/git-upload-archive",
    "/repo.git/HEAD\n",
])
def test_match_refuses_other_paths(path):
    assert routes.match(path) is None

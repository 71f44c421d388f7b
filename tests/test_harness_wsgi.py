"""The harness's in-process WSGI calls: the environ is the one a WSGI server
passes (werkzeug's EnvironBuilder), with the test's CGI variables exact."""

from __future__ import annotations

import os
import wsgiref.validate

from . import harness as h


def test_environ_is_a_wsgi_servers_with_the_request_bytes_as_latin1():
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": "/caf\u00e9.git/git-upload-pack", "QUERY_STRING": "a=%41&b",
           "CONTENT_TYPE": "application/x-git-upload-pack-request", "CONTENT_LENGTH": "4",
           "HTTP_GIT_PROTOCOL": "version=2", "HTTP_CONTENT_ENCODING": "gzip", "REMOTE_USER": "alice",
           "GIT_PROJECT_ROOT": "/srv/git"}
    environ = h.wsgi_environ(env, b"0000")
    wsgiref.validate.check_environ(environ)     # what PEP 3333 asks of a server
    assert environ["PATH_INFO"] == "/caf\u00c3\u00a9.git/git-upload-pack"    # UTF-8 bytes, read as latin-1
    assert environ["REQUEST_URI"] == "/caf%C3%A9.git/git-upload-pack"
    assert environ["QUERY_STRING"] == "a=%41&b" and environ["SCRIPT_NAME"] == ""
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"], environ["SERVER_PROTOCOL"]) == ("localhost", "80", "HTTP/1.1")
    assert environ["HTTP_GIT_PROTOCOL"] == "version=2" and environ["HTTP_CONTENT_ENCODING"] == "gzip"
    assert environ["HTTP_HOST"] == "localhost"
    assert environ["CONTENT_TYPE"] == "application/x-git-upload-pack-request" and environ["CONTENT_LENGTH"] == "4"
    assert environ["REMOTE_USER"] == "alice" and environ["GIT_PROJECT_ROOT"] == "/srv/git"
    assert environ["PATH"] == h.BASE_ENV["PATH"]
    assert environ["wsgi.input"].read() == b"0000" and environ["wsgi.input_terminated"] is True


def test_the_tests_cgi_variables_are_kept_exactly_even_where_no_server_would_send_them():
    bad = "/r\udcff.git/HEAD"                       # os.fsdecode's form of the byte 0xff
    environ = h.wsgi_environ({"PATH_INFO": bad, "QUERY_STRING": "x=\udcfe", "PATH_TRANSLATED": "/srv" + bad,
                              "CONTENT_LENGTH": "3"}, b"body and more")
    assert environ["PATH_INFO"] == "/r\u00ff.git/HEAD" and environ["QUERY_STRING"] == "x=\u00fe"
    assert environ["PATH_TRANSLATED"] == "/srv/r\u00ff.git/HEAD"
    assert environ["CONTENT_LENGTH"] == "3"         # not the body's 13: the app must stop at 3
    assert "REQUEST_METHOD" not in environ and "CONTENT_TYPE" not in environ
    assert h.wsgi_environ({"PATH_INFO": "//x"})["PATH_INFO"] == "//x"      # a path, not an authority
    bare = h.wsgi_environ({"REQUEST_METHOD": "GET"}, b"chunked")
    assert "PATH_INFO" not in bare and "QUERY_STRING" not in bare and "CONTENT_LENGTH" not in bare
    assert bare["wsgi.input"].read() == b"chunked"


def test_wsgi_runs_the_app_under_base_env_and_closes_its_answer(monkeypatch):
    from aspen_cgi import wsgi as app
    seen = {}

    class Answer:
        closed = False

        def __iter__(self):
            return iter([b"one ", b"two"])

        def close(self):
            Answer.closed = True

    def fake(environ, start_response):
        seen["process"] = dict(os.environ)
        seen["root"] = environ["GIT_PROJECT_ROOT"]
        environ["wsgi.errors"].write("logged\n")
        start_response("404 Not Found", [("Content-Type", "text/plain"), ("X-A", "1"), ("X-A", "2")])
        return Answer()

    monkeypatch.setattr(app, "application", fake)
    monkeypatch.setenv("ASPEN_SOMETHING", "from the process")
    r = h.wsgi({"REQUEST_METHOD": "GET", "PATH_INFO": "/x", "GIT_PROJECT_ROOT": "/srv/git"})
    assert seen["process"] == h.BASE_ENV and seen["root"] == "/srv/git"
    assert os.environ["ASPEN_SOMETHING"] == "from the process"
    assert (r.status, r.headers, r.body, r.stderr) == \
        (404, [("Content-Type", "text/plain"), ("X-A", "1"), ("X-A", "2")], b"one two", b"logged\n")
    assert Answer.closed


def test_the_server_imports_no_werkzeug():
    """werkzeug is a test dependency only (setup.cfg's `test` extra): an
    operator's install has none, so neither adapter, the CLI nor the bench may
    import it."""
    import subprocess
    import sys
    probe = ("import sys, aspen_cgi.wsgi, aspen_cgi.cgi, aspen_cgi.cli, bench.cli; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'werkzeug'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=h.REPO_DIR)
    assert out.stdout.strip() == "[]", out.stderr

"""The ASPEN_* settings (aspen_cgi/settings.py): one table, one parser per
kind of value, the request's environment over the process's, and a value
that cannot be parsed refused where it arrives: the WSGI application does
not load (gunicorn's worker fails to boot), an aspen-cgi request gets a 500
with the message in the server's log and never a traceback in its body,
`aspen` exits 2. docs/settings.md is the table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aspen_cgi import settings
from aspen_cgi.http.limits import Limits

from . import harness as h

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
ASPEN = str(Path(sys.executable).parent / "aspen")

# One bad value of each kind: (setting, value, what the message says it accepts)
BAD = [
    ("ASPEN_METRICS", "maybe", "a boolean: true/false, yes/no, on/off, 1/0"),
    ("ASPEN_CACHE_MAX_BYTES", "1x", "bytes, or a number with a k, m or g suffix (500m, 2g)"),
    ("ASPEN_IDLE_TIMEOUT", "soon", "seconds, a number from 0"),
    ("ASPEN_BUILD_WAIT_MS", "-5", "milliseconds, a number from 0"),
    ("ASPEN_PREWARM_DEMAND_S", "a day", "seconds, any number (3600, -1)"),
    ("ASPEN_COLD_PER_REPO", "0", "a whole number from 1"),
    ("ASPEN_QUEUE", "1.5", "a whole number from 0"),
    ("ASPEN_PREWARM", "sometimes", "default, all, off"),
    ("ASPEN_VERSION_PACKS", "later", "auto, off (or a boolean)"),
    ("ASPEN_REMOTE_USER_HEADER", "X Remote User", "an HTTP header name"),
    ("ASPEN_CLUSTER", "git/eu", "a name of letters, digits, -, . and _ (git-eu)"),
]
BAD_IDS = [f"{kind}-{name}" for (name, _, _), kind in zip(BAD, (
    "switch", "size", "seconds", "milliseconds", "any-seconds", "count", "count0", "mode", "mode-or-switch", "header", "name"))]


def _message(name: str, value: str, accepted: str) -> str:
    return f"aspen: bad setting {name}={value!r}: expected {accepted}"


# -- the table and its page --------------------------------------------------------------------------

def test_docs_settings_md_is_the_table():
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert settings.with_table(doc) == doc, \
        "docs/settings.md and settings.TABLE disagree: python -m aspen_cgi.settings --write docs/settings.md"
    for name in settings.NAMES:
        assert f"| `{name}` |" in doc
    for name, _ in settings.INTERNAL:
        assert f"| `{name}`" not in doc


def test_every_aspen_name_in_the_code_is_in_the_table_or_internal():
    known = set(settings.NAMES) | {name for name, _ in settings.INTERNAL}
    assert not set(settings.NAMES) & {name for name, _ in settings.INTERNAL}
    seen = set()
    for path in (ROOT / "aspen_cgi").rglob("*.py"):
        for name in re.findall(r"ASPEN_[A-Z0-9_]*[A-Z0-9]", path.read_text()):
            seen.add(name)
            # ASPEN_COLD_* in prose, ASPEN_FAULT + "_ONCE" in code: a prefix of a known name
            assert name in known or any(k.startswith(name + "_") for k in known), f"{path}: {name}"
    assert set(settings.NAMES) <= seen


def test_no_setting_is_read_from_an_environment_outside_settings_py():
    """settings.py parses every ASPEN_* setting; elsewhere the code asks it
    (settings.of, a Settings), and only internal hand-offs (settings.INTERNAL)
    are read from an environment directly."""
    reads = re.compile(r"""(?:\.get\(|environ\[|env\[)\s*["'](ASPEN_[A-Z0-9_]+)["']""")
    for path in (ROOT / "aspen_cgi").rglob("*.py"):
        if path.name == "settings.py":
            continue
        for name in reads.findall(path.read_text()):
            assert name not in settings.NAMES, f"{path}: reads {name} itself"
    assert reads.findall('x = env.get("ASPEN_CACHE")') == ["ASPEN_CACHE"]    # the pattern sees a read


def test_the_readme_tables_agree_with_the_settings_table():
    """The README's tables of settings (limits, metrics) name settings that
    exist, with the defaults settings.TABLE gives them."""
    rows = re.findall(r"^\| `(ASPEN_[A-Z0-9_]+)` \| ([^|]+) \|", (ROOT / "README.md").read_text(), re.M)
    assert len(rows) >= 5
    defaults = {row[0]: row[4] for row in settings.TABLE}
    for name, cell in rows:
        assert name in defaults, f"README names {name}, which settings.py does not have"
        assert cell.strip().startswith(defaults[name].split(" (")[0]), (name, cell, defaults[name])


def test_defaults_and_each_kind_parsed():
    s = settings.parse([None] * len(settings.TABLE))
    assert (s.access_log, s.metrics, s.cache, s.refstore, s.wide_depth1) == (True, False, True, True, True)
    assert (s.cache_max_bytes, s.cache_reserve_bytes, s.max_push_bytes) == (1 << 30, 64 << 20, 0)
    assert (s.idle_timeout, s.request_timeout, s.build_wait, s.compact_quiet) == (60.0, 3600.0, 0.05, 1.0)
    assert (s.prewarm, s.version_packs, s.state_dir, s.remote_user_header) == ("default", "auto", None, None)
    cores = os.cpu_count() or 2
    assert (s.cold_per_repo, s.cold_per_server, s.builds_per_server) == (cores, 2 * cores, max(1, cores // 2))
    assert s.run_dir == f"/tmp/aspen-run-{os.getuid()}"

    def one(name: str, value: str):
        row = settings.NAMES.index(name)
        return getattr(settings.parse([value if i == row else None for i in range(len(settings.NAMES))]),
                       settings.TABLE[row][1])

    for word, value in [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("false", False),
                        ("No", False), ("off", False)]:
        assert one("ASPEN_METRICS", word) is value
    assert one("ASPEN_CACHE_MAX_BYTES", "1g") == 1 << 30
    assert one("ASPEN_CACHE_MAX_BYTES", "500m") == 500 << 20
    assert one("ASPEN_CACHE_RESERVE_BYTES", "12345") == 12345
    assert one("ASPEN_MAX_PUSH_BYTES", " 2K ") == 2048
    assert one("ASPEN_IDLE_TIMEOUT", "0.5") == 0.5
    assert one("ASPEN_BUILD_WAIT_MS", "250") == 0.25
    assert one("ASPEN_PREWARM_DEMAND_S", "-1") == -1.0
    assert one("ASPEN_QUEUE", "0") == 0
    assert one("ASPEN_PREWARM", "ALL") == "all"
    assert one("ASPEN_VERSION_PACKS", "false") == "off"
    assert one("ASPEN_VERSION_PACKS", "on") == "auto"
    assert one("ASPEN_REMOTE_USER_HEADER", "X-Remote-User") == "X-Remote-User"
    assert one("ASPEN_CLUSTER", "git-eu.2_b") == "git-eu.2_b"
    assert one("ASPEN_STATE_DIR", "") is None                   # empty is unset


@pytest.mark.parametrize("name,value,accepted", BAD, ids=BAD_IDS)
def test_a_bad_value_is_an_error_naming_setting_value_and_what_is_accepted(name, value, accepted):
    with pytest.raises(settings.SettingsError) as e:
        settings.of({name: value})
    assert str(e.value).startswith(_message(name, value, accepted))
    assert e.value.problems[0][:2] == (name, value)


def test_every_bad_value_is_named_at_once():
    with pytest.raises(settings.SettingsError) as e:
        settings.of({"ASPEN_METRICS": "maybe", "ASPEN_QUEUE_WAIT": "inf", "ASPEN_STORE_WAIT": "nan"})
    assert [p[0] for p in e.value.problems] == ["ASPEN_METRICS", "ASPEN_STORE_WAIT", "ASPEN_QUEUE_WAIT"]


def test_a_pack_store_without_a_database_is_an_error(monkeypatch):
    """A cluster's node needs both: the log (ASPEN_REFSTORE_URL) and the packs (ASPEN_PACK_STORE)."""
    monkeypatch.delenv("ASPEN_REFSTORE_URL", raising=False)
    with pytest.raises(settings.SettingsError) as e:
        settings.of({"ASPEN_PACK_STORE": "/srv/packs"})
    assert e.value.problems[0][:2] == ("ASPEN_PACK_STORE", "/srv/packs")
    assert "ASPEN_REFSTORE_URL" in str(e.value)
    s = settings.of({"ASPEN_PACK_STORE": "/srv/packs", "ASPEN_REFSTORE_URL": "postgresql://aspen@db/aspen"})
    assert s.pack_store == "/srv/packs"


def test_an_unknown_aspen_name_is_ignored():
    assert settings.of({"ASPEN_TEST_KEY": "anything"}).metrics is False


# -- precedence and caching --------------------------------------------------------------------------

def test_the_request_environment_beats_the_process_environment(monkeypatch):
    monkeypatch.setenv("ASPEN_MAX_PUSH_BYTES", "1m")
    monkeypatch.setenv("ASPEN_IDLE_TIMEOUT", "7")
    request = {"ASPEN_MAX_PUSH_BYTES": "2m", "ASPEN_IDLE_TIMEOUT": ""}
    limits = Limits.from_env(request)
    assert limits.max_push_bytes == 2 << 20       # the request's
    assert limits.idle_timeout == 7.0             # empty in the request: the process's
    assert Limits.from_env({}).max_push_bytes == 1 << 20
    assert settings.of(None).max_push_bytes == settings.of(os.environ).max_push_bytes == 1 << 20
    # a bad value the request overrides is not read
    monkeypatch.setenv("ASPEN_CACHE_MAX_BYTES", "lots")
    assert settings.of({"ASPEN_CACHE_MAX_BYTES": "3g"}).cache_max_bytes == 3 << 30
    with pytest.raises(settings.SettingsError):
        settings.of({})


def test_through_the_wsgi_adapter_the_request_environment_wins(root):
    """harness.wsgi runs the application with the process environment
    BASE_ENV (ASPEN_ACCESS_LOG=0) and the request's environ on top."""
    assert h.BASE_ENV["ASPEN_ACCESS_LOG"] == "0"
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/repo.git/info/refs", "QUERY_STRING": "service=git-upload-pack"}
    quiet = h.wsgi(env)
    logged = h.wsgi(dict(env, ASPEN_ACCESS_LOG="1"))
    assert quiet.status == logged.status == 200
    assert b"aspen: repo=" not in quiet.stderr
    assert b"aspen: repo=" in logged.stderr


def test_parsed_once_per_environment(monkeypatch):
    calls = []
    parse = settings.parse
    monkeypatch.setattr(settings, "parse", lambda values: calls.append(1) or parse(values))
    env = {"ASPEN_QUEUE": "17", "ASPEN_PREWARM_DEMAND_S": "5", "PATH_INFO": "/a"}
    first = settings.of(dict(env))
    assert settings.of(dict(env, PATH_INFO="/b")) is first      # what is not a setting does not count
    assert len(calls) <= 1
    assert settings.of(dict(env, ASPEN_QUEUE="18")).queue == 18
    assert first.queue == 17


# -- refused where it arrives ------------------------------------------------------------------------

@pytest.mark.parametrize("name,value,accepted", BAD, ids=BAD_IDS)
def test_wsgi_application_does_not_load_with_a_bad_setting(name, value, accepted):
    env = dict(os.environ, **{name: value})
    res = subprocess.run([sys.executable, "-c", "import aspen_cgi.wsgi"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=str(ROOT))
    assert res.returncode != 0
    assert _message(name, value, accepted) in res.stderr


def test_gunicorn_worker_fails_to_boot_and_says_why(tmp_path):
    """gunicorn's master listens before its workers load the application; the
    worker that cannot load it fails to boot, and gunicorn exits."""
    (tmp_path / "root").mkdir()
    server = h.Server(tmp_path / "root", {"ASPEN_CACHE_MAX_BYTES": "1x"}, workers=1)
    try:
        try:
            server.start()
        except AssertionError:
            pass                # exited before it said it listens
        assert server.proc.wait(timeout=60) != 0
    finally:
        server.stop()
    log = server.log_text()
    assert "Worker failed to boot" in log
    assert _message("ASPEN_CACHE_MAX_BYTES", "1x", BAD[1][2]) in log


@pytest.mark.parametrize("name,value,accepted", BAD, ids=BAD_IDS)
def test_cgi_request_with_a_bad_setting_gets_500_and_the_message_in_the_log(root, name, value, accepted):
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/repo.git/info/refs", "QUERY_STRING": "service=git-upload-pack", name: value}
    res = h.aspen(env)
    assert res.status == 500
    assert res.body == settings.REFUSED_BODY
    assert b"Traceback" not in res.body and value.encode() not in res.body
    assert _message(name, value, accepted).encode() in res.stderr
    assert b"Traceback" not in res.stderr


def test_wsgi_request_with_a_bad_setenv_gets_500_and_the_message_in_the_log(root):
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/repo.git/info/refs", "QUERY_STRING": "service=git-upload-pack",
           "ASPEN_REQUEST_TIMEOUT": "1h"}
    res = h.wsgi(env)
    assert res.status == 500
    assert res.body == settings.REFUSED_BODY
    assert _message("ASPEN_REQUEST_TIMEOUT", "1h", "seconds, a number from 0").encode() in res.stderr
    assert b"Traceback" not in res.stderr


@pytest.mark.parametrize("name,value,accepted", BAD, ids=BAD_IDS)
def test_aspen_command_exits_2_with_the_message(root, name, value, accepted):
    res = subprocess.run([ASPEN, "stats", str(root / "repo.git")], env=dict(os.environ, **{name: value}),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert _message(name, value, accepted) in res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


@pytest.mark.parametrize("value,expected", [("1g", 1 << 30), ("500m", 500 << 20), ("2g", 2 << 30),
                                            ("1048576", 1 << 20)])
def test_cache_max_bytes_takes_git_size_units(root, value, expected):
    """ASPEN_CACHE_MAX_BYTES=1g is 1 GiB (it fell back to the default, which
    happens to be 1 GiB, as 500m did: int() could not parse them)."""
    res = subprocess.run([ASPEN, "stats", "--json", str(root / "repo.git")],
                         env=dict(os.environ, ASPEN_CACHE_MAX_BYTES=value), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["repositories"][0]["max_bytes"] == expected


def test_every_setting_is_declared_for_the_type_checker():
    """Settings' `if TYPE_CHECKING:` block names each TABLE row's attribute (mypy checks their uses)."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(settings.Settings))
    block = next(n for n in ast.walk(tree) if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    declared = [n.target.id for n in block.body if isinstance(n, ast.AnnAssign)]
    assert sorted(declared) == sorted(row[1] for row in settings.TABLE)

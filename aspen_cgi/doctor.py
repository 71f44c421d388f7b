"""`aspen doctor`: what breaks deployments, checked on the server the way the
server will meet it, one line per finding with how to fix it. Run as root,
everything a request would touch (repositories, their state, the run
directory, git's ownership check, the stores) is checked by a child process
that has become the server's user, so the doctor itself leaves no file
behind that the server cannot write. Findings are `ok`, `note` (worth
knowing, nothing broken) or `FAIL` (the exit status is 1)."""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator, Mapping, Optional

from . import settings as aspen_settings

OK, NOTE, FAIL = "ok", "note", "FAIL"


@dataclass(frozen=True)
class Finding:
    level: str
    check: str
    text: str


@dataclass(frozen=True)
class Checkup:
    """What to examine, parsed once from the command line and the environment."""
    repos: list[str]
    user: str                       # the web server's user, as whom the repositories are checked
    env: dict[str, str]             # the server's settings (this process's environment, with Apache's SetEnv)
    apache_dir: str                 # /etc/apache2
    units: list[str]                # systemd unit files of the server: Environment=, User=, PrivateTmp
    url: Optional[str] = None
    sources: dict[str, str] = field(default_factory=dict)   # setting -> where it came from


# -- where settings come from ---------------------------------------------------------------------

SETENV = re.compile(r"^\s*SetEnv\s+(ASPEN_\w+|GIT_PROJECT_ROOT)\s*(.*?)\s*$")


def apache_conf_files(apache_dir: str) -> Iterator[str]:
    for sub in ("apache2.conf", "conf-enabled", "sites-enabled"):
        path = os.path.join(apache_dir, sub)
        if os.path.isfile(path):
            yield path
        elif os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                if name.endswith(".conf") or sub == "sites-enabled":
                    yield os.path.join(path, name)


def _lines(paths: Iterator[str]) -> Iterator[tuple[str, int, str]]:
    """(path, line number, line) of every line of PATHS but comments; a file that cannot be read is skipped."""
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    if not line.lstrip().startswith("#"):
                        yield path, n, line
        except OSError:
            continue


def apache_setenv(apache_dir: str) -> dict[str, tuple[str, str]]:
    """NAME -> (value, file:line) of Apache's enabled SetEnv lines for Aspen."""
    found: dict[str, tuple[str, str]] = {}
    for path, n, line in _lines(apache_conf_files(apache_dir)):
        m = SETENV.match(line)
        if m:
            found[m.group(1)] = (m.group(2).strip('"'), f"{path}:{n}")
    return found


def apache_user(apache_dir: str) -> Optional[str]:
    try:
        with open(os.path.join(apache_dir, "envvars"), encoding="utf-8") as f:
            m = re.search(r"^export APACHE_RUN_USER=(\S+)", f.read(), re.M)
            return m.group(1) if m else None
    except OSError:
        return None


APACHE_UNITS = ("/lib/systemd/system/apache2.service", "/etc/systemd/system/apache2.service")
GUNICORN_UNIT = "/etc/systemd/system/aspen-gunicorn.service"


def serves_aspen(apache_dir: str) -> bool:
    """Does Apache's enabled configuration run Aspen (aspen-cgi, or aspen.wsgi)?"""
    for _, _, line in _lines(apache_conf_files(apache_dir)):
        words = line.split()
        if words and words[0] in ("ScriptAlias", "WSGIScriptAlias") and \
                any("aspen-cgi" in w or w.endswith("aspen.wsgi") for w in words[1:]):
            return True
    return False


def unit_files(unit: str) -> Iterator[str]:
    """A systemd unit file and its drop-ins (UNIT.d/*.conf), in the order systemd reads them."""
    yield unit
    try:
        drop_ins = sorted(n for n in os.listdir(unit + ".d") if n.endswith(".conf"))
    except OSError:
        drop_ins = []
    for name in drop_ins:
        yield os.path.join(unit + ".d", name)


def unit_settings(unit: str) -> tuple[dict[str, tuple[str, str]], Optional[str]]:
    """A systemd unit's Environment= values (NAME -> (value, unit:line)) and its User=."""
    found: dict[str, tuple[str, str]] = {}
    user = None
    for path, n, line in _lines(unit_files(unit)):
        line = line.strip()
        if line.startswith("Environment="):
            for item in line[len("Environment="):].split():
                name, _, value = item.strip('"').partition("=")
                found[name] = (value, f"{path}:{n}")
        elif line.startswith("User="):
            user = line[len("User="):].strip()
    return found, user


def checkup(repos: list[str], user: Optional[str], apache_dir: str, units: Optional[list[str]],
            url: Optional[str], environ: Mapping[str, str]) -> Checkup:
    """What to examine: UNITS named (else Apache's when it serves Aspen, and
    aspen-gunicorn.service where it is installed); the settings of this
    environment, then those units' Environment= lines, then Apache's SetEnv."""
    apache = serves_aspen(apache_dir)
    if units is None:
        units = [*(APACHE_UNITS if apache else ()), *((GUNICORN_UNIT,) if os.path.exists(GUNICORN_UNIT) else ())]
    env = {k: v for k, v in environ.items()}
    sources = {k: "environment" for k in env if k.startswith("ASPEN_") or k == "GIT_PROJECT_ROOT"}
    unit_user = None
    for unit in units:
        values, who = unit_settings(unit)
        unit_user = unit_user or who
        for name, (value, where) in values.items():
            if name not in env:
                env[name] = value
                sources[name] = where
    for name, (value, where) in (apache_setenv(apache_dir) if apache else {}).items():
        if name not in env:
            env[name] = value
            sources[name] = where
    if not repos and env.get("GIT_PROJECT_ROOT"):
        from .git.discovery import repositories  # startup
        repos = repositories(env["GIT_PROJECT_ROOT"])
    who = (user or unit_user or (apache_user(apache_dir) if apache else None)
           or pwd.getpwuid(os.geteuid()).pw_name)
    return Checkup([os.path.abspath(r) for r in repos], who, env, apache_dir, list(units), url, sources)


# -- checks made as this process (root, or the operator) ------------------------------------------

def settings_findings(c: Checkup) -> list[Finding]:
    try:
        aspen_settings.of(c.env)
    except aspen_settings.SettingsError as e:
        return [Finding(FAIL, "settings", f"{e}".strip() + " (fix the value; the server answers 500 meanwhile)")]
    out = [Finding(OK, "settings", "every setting parses")]
    for name in sorted(c.sources):
        out.append(Finding(NOTE, "settings", f"{name}={c.env[name]} (from {c.sources[name]})"))
    return out


def apache_findings(c: Checkup) -> list[Finding]:
    if not os.path.isdir(c.apache_dir):
        return []
    text = "".join(line for _, _, line in _lines(apache_conf_files(c.apache_dir)))
    mods = set()
    try:
        mods = {n[:-5] for n in os.listdir(os.path.join(c.apache_dir, "mods-enabled")) if n.endswith(".load")}
    except OSError:
        pass
    out = []
    if "aspen-cgi" in text:
        if mods & {"cgi", "cgid"}:
            out.append(Finding(OK, "apache", f"aspen-cgi is configured and {'/'.join(sorted(mods & {'cgi', 'cgid'}))} "
                                             f"is enabled"))
        else:
            out.append(Finding(FAIL, "apache", "aspen-cgi is configured but no CGI module is enabled (the event "
                                               "MPM loads none): a2enmod cgid && systemctl restart apache2"))
    if "WSGIScriptAlias" in text and "aspen" in text:
        if "wsgi" in mods:
            out.append(Finding(OK, "apache", "Aspen's WSGI script is configured and wsgi is enabled"))
        else:
            out.append(Finding(FAIL, "apache", "Aspen's WSGI script is configured but mod_wsgi is not enabled: "
                                               "apt-get install libapache2-mod-wsgi-py3 && a2enmod wsgi"))
    return out


def _private_tmp(unit: str) -> bool:
    value = False
    for _, _, line in _lines(unit_files(unit)):
        m = re.match(r"^\s*PrivateTmp\s*=\s*(\S+)", line)
        if m:
            value = m.group(1).lower() in ("true", "yes", "1", "on")
    return value


def url_findings(c: Checkup) -> list[Finding]:
    if not c.url:
        return []
    import urllib.error  # startup
    import urllib.request  # startup
    target = c.url.rstrip("/") + "/info/refs?service=git-upload-pack"
    try:
        with urllib.request.urlopen(target, timeout=30) as r:
            kind = r.headers.get("Content-Type", "")
            if r.status == 200 and kind == "application/x-git-upload-pack-advertisement":
                return [Finding(OK, "url", f"{target}: 200, {kind}")]
            return [Finding(FAIL, "url", f"{target}: {r.status} {kind}: not a smart-HTTP answer (is the URL the "
                                         f"repository's, and the server Aspen?)")]
    except urllib.error.HTTPError as e:
        return [Finding(FAIL, "url", f"{target}: {e.code} {e.reason} (the server's error log says why)")]
    except (OSError, ValueError) as e:
        return [Finding(FAIL, "url", f"{target}: cannot be fetched ({e})")]


# -- checks made as the server's user ------------------------------------------------------------

PATIENCE_S = 5.0        # a database that answers no sooner is said to be unreachable


def as_user_findings(c: Checkup) -> list[Finding]:
    """Every check a request's process would meet, made by this process as it is."""
    try:
        s = aspen_settings.of(c.env)
    except aspen_settings.SettingsError:
        return []
    from .refstore import db  # startup
    with db.patience(PATIENCE_S):
        return _as_user_findings(c, s)


def _as_user_findings(c: Checkup, s) -> list[Finding]:
    out: list[Finding] = []
    if s.run_dir.startswith(("/tmp/", "/var/tmp/")) and any(_private_tmp(u) for u in c.units):
        out.append(Finding(FAIL, "run-dir", f"the web server runs with PrivateTmp=true, so its {s.run_dir} is not "
                                            f"the one this shell sees: aspen stats --server and aspen resident "
                                            f"cannot find it and commands take other build slots; set "
                                            f"ASPEN_RUN_DIR to a directory outside /tmp and /var/tmp that "
                                            f"{c.user} owns, e.g. `install -d -o {c.user} /opt/aspen/run` and "
                                            f"`SetEnv ASPEN_RUN_DIR "
                                            f"/opt/aspen/run` (docs/install.md)"))
    out += _run_dir_findings(s, c.user)
    cluster = _cluster_findings(s, c.user)
    out += cluster
    stores = not any(f.check == "postgresql" and f.level == FAIL for f in cluster)
    for repo in c.repos:
        out += _repo_findings(repo, s, c, stores)
    if not c.repos:
        out.append(Finding(NOTE, "repos", "no repository named, and no GIT_PROJECT_ROOT to find them under"))
    return out


def _some(paths: list[str]) -> str:
    """The first three of PATHS, and whether there are more."""
    return ", ".join(paths[:3]) + (" and more" if len(paths) > 3 else "")


def _unwritable_under(path: str, depth: int = 2) -> list[str]:
    bad = []
    for d, dirs, files in os.walk(path):
        if d[len(path):].count("/") >= depth:
            dirs[:] = []
        for name in [*dirs, *files]:
            p = os.path.join(d, name)
            if not os.path.islink(p) and not os.access(p, os.W_OK):
                bad.append(p)
    return bad


def _run_dir_findings(s, user: str) -> list[Finding]:
    run = s.run_dir
    if not os.path.isdir(run):
        parent = os.path.dirname(run.rstrip("/")) or "/"
        if os.access(parent, os.W_OK | os.X_OK):
            return [Finding(OK, "run-dir", f"{run} is made on first request ({user} can)")]
        return [Finding(FAIL, "run-dir", f"{run} does not exist and {user} cannot make it: mkdir -p {run} && "
                                         f"chown {user} {run}")]
    bad = ([run] if not os.access(run, os.W_OK | os.X_OK) else []) + _unwritable_under(run, 1)
    if bad:
        return [Finding(FAIL, "run-dir", f"{user} cannot write {_some(bad)}: admission and build slots go "
                                         f"uncounted there; chown -R {user} {run}")]
    out = [Finding(OK, "run-dir", f"{run}: admission and build slots writable by {user}")]
    from . import handoff, resident  # startup
    sock = handoff.socket_path(run)
    if len(sock.encode()) > handoff.SUN_PATH_MAX:
        out.append(Finding(FAIL, "resident", f"{run} is too long for the resident's socket ({len(sock.encode())} "
                                             f"bytes, at most {handoff.SUN_PATH_MAX}): under CGI every request "
                                             f"would import the whole pipeline (60 ms or more); set a shorter "
                                             f"ASPEN_RUN_DIR"))
        return out
    residents = resident.running(run)
    if residents:
        out += [Finding(OK, "resident", f"pid {r.pid or '-'} serving {r.socket}") for r in residents]
    else:
        out.append(Finding(NOTE, "resident", f"none running for {user} in {run} (aspen-cgi starts one on first "
                                             f"need)"))
    return out


def _cluster_findings(s, user: str) -> list[Finding]:
    out = []
    if s.refstore_url:
        from .refstore import registry  # startup
        try:
            stores = registry.database_stores(s.refstore_url)
            out.append(Finding(OK, "postgresql", f"reachable, {len(stores)} stores"))
        except Exception as e:     # noqa: BLE001  (the driver's, the pool's or a timeout: all say the same)
            out.append(Finding(FAIL, "postgresql", f"ASPEN_REFSTORE_URL unreachable or not initialised ({e}); "
                                                   f"requests serve refs from disk and pushes fail: check the "
                                                   f"server, pg_hba.conf and `aspen db init`"))
    if s.node_url and s.refstore_url:
        out += _node_findings(s)
    if s.pack_store:
        if os.path.isdir(s.pack_store) and os.access(s.pack_store, os.W_OK | os.X_OK):
            out.append(Finding(OK, "pack-store", f"{s.pack_store} writable by {user}"))
        else:
            out.append(Finding(FAIL, "pack-store", f"{s.pack_store} is missing or not writable by {user}: pushes "
                                                   f"are refused; mount it and chown {user} it"))
    return out


def _answers(url: str) -> bool:
    """Whether an Aspen node answers at URL (any HTTP status to an unsigned pack request)."""
    import http.client  # startup
    from urllib.parse import urlsplit  # startup
    u = urlsplit(url)
    conn = (http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection)(u.netloc, timeout=5)
    try:
        conn.request("GET", u.path.rstrip("/") + "/_aspen/packs/doctor/" + "0" * 40 + ".pack")
        return conn.getresponse().status in (403, 404)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _node_findings(s) -> list[Finding]:
    """Packs between nodes: the nodes the log knows, and whether each answers."""
    from .refstore import db, db_postgres, peers  # startup
    try:
        conn = db.pgconn.PgConn(s.refstore_url, "public", 1, db.PG_USE_SCHEMA)
        db_postgres.pg_peers_init(conn)
        known = db_postgres.pg_nodes(conn)
    except (db.Error, db.Busy) as e:
        return [Finding(FAIL, "nodes", f"the log's list of nodes cannot be read ({e})")]
    now = time.time()
    live = [n for n, seen, _ in known if now - seen < peers.GONE_S]
    older = [n for n, seen, at in known if now - seen < peers.GONE_S and at < db.SCHEMA_VERSION]
    out = []
    if older:
        out.append(Finding(NOTE, "nodes", f"{', '.join(older)} run(s) an older Aspen: stores stay at the schema "
                                          f"it writes until every node runs this one (docs/cluster.md, Upgrading)"))
    if _answers(s.node_url):
        out.append(Finding(OK, "node-url", f"{s.node_url} answers"))
    else:
        out.append(Finding(FAIL, "node-url", f"{s.node_url} (ASPEN_NODE_URL) does not answer: the other nodes "
                                             f"can neither send this one packs nor fetch from it"))
    for node in live:
        if node != s.node_url and not _answers(node):
            out.append(Finding(NOTE, "nodes", f"{node} does not answer from here"))
    if len(set(live) | {s.node_url}) < s.replicas:
        out.append(Finding(NOTE, "nodes", f"{len(set(live) | {s.node_url})} node(s) known, ASPEN_REPLICAS is "
                                          f"{s.replicas}: each push is kept on every node until more join"))
    else:
        out.append(Finding(OK, "nodes", f"{len(live)} known; each push kept on {s.replicas} of them"))
    return out


def _repo_findings(repo: str, s, c: Checkup, stores: bool) -> list[Finding]:
    if not os.access(repo, os.R_OK | os.X_OK) or not os.access(os.path.join(repo, "HEAD"), os.R_OK):
        return [Finding(FAIL, "read", f"{repo}: {c.user} cannot read it (clones fail): chown -R {c.user} {repo}, "
                                      f"or give its group read access, and let {c.user} through every directory "
                                      f"above it")]
    out = []
    unwritable = [d for d in ("objects", "refs") if not os.access(os.path.join(repo, d), os.W_OK)]
    if unwritable:
        dirs = " and ".join(d + "/" for d in unwritable)
        out.append(Finding(FAIL, "write", f"{repo}: {c.user} cannot write {dirs} (pushes fail): "
                                          f"chown -R {c.user} {repo}"))
    from .git import gitexec  # startup
    git = gitexec.git(["rev-parse", "--absolute-git-dir"], cwd=repo, timeout=60,
                      env=gitexec.GitEnv(_git_env(c)))      # found, not named: git checks its owner
    if b"dubious ownership" in git.stderr:
        out.append(Finding(FAIL, "ownership", f"{repo}: git refuses it for {c.user} (dubious ownership: it belongs "
                                              f"to another user; stock and Aspen answer 500): chown -R {c.user} "
                                              f"{repo}, or git config --system --add safe.directory {repo}"))
    from .runtime.statedir import state_dir  # startup
    state = state_dir(repo, s)
    if os.path.isdir(state):
        bad = ([state] if not os.access(state, os.W_OK | os.X_OK) else []) + _unwritable_under(state)
        if bad:
            out.append(Finding(FAIL, "state", f"{repo}: {c.user} cannot write {_some(bad)} (left by a command run as "
                                              f"another user?): the ref store and the response cache are off for "
                                              f"it, every answer computed; chown -R {c.user} {state}"))
        elif stores:
            out += _store_findings(repo, s, c)
    elif not os.access(os.path.dirname(state.rstrip("/")), os.W_OK | os.X_OK):
        out.append(Finding(FAIL, "state", f"{repo}: {c.user} cannot make {state}: Aspen serves it as stock would, "
                                          f"without its store; chown {c.user} {os.path.dirname(state)} or set "
                                          f"ASPEN_STATE_DIR"))
    else:
        out.append(Finding(NOTE, "state", f"{repo}: not seen by Aspen yet (its first request records it; aspen "
                                          f"import does it ahead)"))
    if not any(f.level == FAIL for f in out):
        out.insert(0, Finding(OK, "repo", f"{repo}: readable and writable by {c.user}"))
    return out


def _git_env(c: Checkup) -> dict[str, str]:
    env = {k: v for k, v in c.env.items() if not k.startswith("GIT_")}
    env["HOME"] = os.environ.get("HOME", "/")
    return env


def _store_findings(repo: str, s, c: Checkup) -> list[Finding]:
    from .git.reader import read_refs  # startup
    from .refstore import db  # startup
    from .refstore.registry import unbuilt_count  # startup
    from .refstore.store import RefStore  # startup
    from .runtime.repository import Repository  # startup
    env = dict(c.env, GIT_DIR=repo)
    try:
        store = RefStore.open(Repository.of(repo, env), create=False)
        if store is None:
            return [Finding(NOTE, "store", f"{repo}: no ref store yet (its first request makes it)")]
        stored = {r.name: r.oid for r in store.snapshot().refs}
        latest = store.latest()
    except (db.Error, db.Busy, OSError) as e:
        return [Finding(FAIL, "store", f"{repo}: the ref store cannot be read ({e}): aspen verify {repo}")]
    disk = {r.name: r.oid for r in read_refs(repo, env).refs}
    behind = sorted(k for k in set(stored) | set(disk) if stored.get(k) != disk.get(k))
    out = []
    if behind:
        out.append(Finding(NOTE, "store", f"{repo}: version {latest}, {len(behind)} refs changed on disk "
                                          f"since (e.g. {behind[0]}); the next request records them as an "
                                          f"external version"))
    else:
        out.append(Finding(OK, "store", f"{repo}: version {latest}, equal to the refs on disk"))
    waiting = unbuilt_count(store.path, s.refstore_url)
    if waiting:
        out.append(Finding(NOTE, "packs", f"{repo}: {waiting} versions wait for their packs (fetches of them get "
                                          f"git's answer meanwhile; aspen import {repo} builds them now)"))
    return out


# -- running the checks ----------------------------------------------------------------------------

def _as_user(c: Checkup) -> list[Finding]:
    """as_user_findings(C), by a child that became C.user when this is root."""
    if os.geteuid() != 0 or c.user == "root":
        return as_user_findings(c)
    try:
        pw = pwd.getpwnam(c.user)
    except KeyError:
        return [Finding(FAIL, "user", f"no user {c.user} on this machine (--user names the web server's)")]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            from .runtime import runas  # startup
            runas.become(runas.Owner(pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir))
            data = json.dumps([asdict(f) for f in as_user_findings(c)]).encode()
            with os.fdopen(w, "wb") as out:
                out.write(data)
        except BaseException as e:      # noqa: BLE001  (said by the parent)
            try:
                os.write(w, json.dumps([asdict(Finding(FAIL, "user", f"checking as {c.user} failed: {e}"))]).encode())
            except OSError:
                pass
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    try:
        return [Finding(**d) for d in json.loads(data or b"[]")]
    except (ValueError, TypeError):
        return [Finding(FAIL, "user", f"checking as {c.user} gave no answer")]


def examine(c: Checkup) -> list[Finding]:
    return [*settings_findings(c), *apache_findings(c), *_as_user(c), *url_findings(c)]


def report(findings: list[Finding], as_json: bool, out=sys.stdout) -> int:
    if as_json:
        json.dump([asdict(f) for f in findings], out, indent=1)
        out.write("\n")
    else:
        for f in findings:
            out.write(f"{f.level:<5} {f.check}: {f.text}\n")
        fails = sum(f.level == FAIL for f in findings)
        out.write(f"{fails} problem{'s' if fails != 1 else ''} found\n" if fails else "no problem found\n")
    return 1 if any(f.level == FAIL for f in findings) else 0

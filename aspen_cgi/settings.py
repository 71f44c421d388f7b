"""Every ASPEN_* setting, in one table, parsed in one place.

An operator sets these in the server's environment: the process's (gunicorn,
a shell, systemd) or the request's (mod_wsgi's and Apache's SetEnv, the CGI
environment). For each setting a non-empty value in the request's
environment wins, then a non-empty value in the process environment, then
the default; an empty value is the same as none.

One convention per kind of value:

- switch: git's booleans (true/false, yes/no, on/off, 1/0, as
  gitvalues.parse_bool);
- size: git's units (plain bytes, or a k, m or g suffix: 500m, 2g; as
  gitvalues.parse_size);
- seconds, milliseconds: a decimal number (the value is in seconds either way);
- count: a whole number;
- a setting with named modes accepts those names (ASPEN_PREWARM,
  ASPEN_VERSION_PACKS), paths and header names as given.

A value that cannot be parsed is an error (SettingsError, naming the setting,
the value and what is accepted), raised by `of()`; never a silent default.
The adapters call `of()` first: the WSGI application refuses to load,
aspen-cgi answers 500 with the message in the server's log, `aspen` exits 2.

`of(env)` returns the parsed settings of an environment, cached by the raw
values, so that a long-lived process parses each environment once and every
later call is a dictionary lookup. docs/settings.md is this table
(`python -m aspen_cgi.settings` prints it; tests/test_settings.py checks it).

Imports only posix, sys and gitvalues (not os: ~1 ms), and builds only plain tuples and two plain
classes at import (no dataclass, no typing): aspen-cgi reads its settings
before anything else, its fast path (http/replay.py) included."""

from __future__ import annotations

import posix
import sys

from .model.gitvalues import ConfigError, parse_bool, parse_size

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds
if TYPE_CHECKING:
    from typing import Mapping, Optional

# -- kinds of value --------------------------------------------------------------------------------

SWITCH = "switch"           # git's booleans -> bool
SIZE = "size"               # bytes, k/m/g -> int
SECONDS = "seconds"         # a number >= 0 -> float seconds
ANY_SECONDS = "any-seconds"   # any number (negative allowed) -> float seconds
MILLISECONDS = "ms"         # a number >= 0 of milliseconds -> float seconds
COUNT = "count"             # a whole number >= 1 -> int
COUNT0 = "count0"           # a whole number >= 0 -> int
PATH = "path"               # a path, as given -> str
HEADER = "header"           # an HTTP header name -> str
NAME = "name"               # a name of letters, digits, `-`, `.` and `_` -> str
DB_URL = "db-url"           # a postgresql:// (or postgres://) connection URL -> str
HTTP_URL = "http-url"       # an http:// or https:// URL, without a trailing slash -> str
SECRET = "secret"           # a text of at least 16 characters -> str
PERCENT = "percent"         # a whole number from 1 to 100 -> int
PROXIES = "proxies"         # addresses and networks, `unix` -> tuple of ipaddress networks and "unix"
# A mode is a dict: each accepted word (lower case) -> the value it means.

_BOOL_WORDS = "`true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0`"
ACCEPTED = {
    SWITCH: "a boolean: " + _BOOL_WORDS,
    SIZE: "bytes, or a number with a `k`, `m` or `g` suffix (`500m`, `2g`)",
    SECONDS: "seconds, a number from `0` (`0.5`, `60`)",
    ANY_SECONDS: "seconds, any number (`3600`, `-1`)",
    MILLISECONDS: "milliseconds, a number from `0` (`250`, `2000`)",
    COUNT: "a whole number from `1`",
    COUNT0: "a whole number from `0`",
    PATH: "a directory",
    HEADER: "an HTTP header name (`X-Remote-User`)",
    NAME: "a name of letters, digits, `-`, `.` and `_` (`git-eu`)",
    DB_URL: "a `postgresql://` URL (libpq's: `postgresql://aspen@db.example/aspen`)",
    HTTP_URL: "an `http://` or `https://` URL (`http://10.0.0.2:8080`)",
    SECRET: "a text of at least 16 characters",
    PERCENT: "a whole number from `1` to `100` (per cent)",
    PROXIES: "addresses and networks, separated by commas (`127.0.0.1, 10.0.0.0/8, ::1`), and `unix` for a "
             "peer on a unix socket",
}


def _cores() -> int:
    return posix.cpu_count() or 2


def _run_dir() -> str:
    return f"/tmp/aspen-run-{posix.getuid()}"


_VERSION_PACKS = {"auto": "auto", "off": "off", "on": "auto", "true": "auto", "yes": "auto", "1": "auto",
                  "false": "off", "no": "off", "0": "off"}
_PREWARM = {"default": "default", "all": "all", "off": "off"}

# -- the operator's settings -----------------------------------------------------------------------
# (name, attribute, kind, default (or a function of nothing), default as docs/settings.md shows it,
#  accepted values as it shows them (None: the kind's), meaning)

TABLE = (
    # where state lives, what is logged and counted
    ("ASPEN_STATE_DIR", "state_dir", PATH, None, "unset: `<repo>/aspen/`", None,
     "keep each repository's state (ref store, packs, cache) under this directory, at the repository's "
     "absolute path, instead of inside the repository (read-only repositories)"),
    ("ASPEN_RUN_DIR", "run_dir", PATH, _run_dir, "`/tmp/aspen-run-<uid>`", None,
     "the machine's admission and build slots, and the metrics when ASPEN_STATE_DIR is unset"),
    ("ASPEN_ACCESS_LOG", "access_log", SWITCH, True, "`1`", None,
     "one line per request on the server's error log (`aspen: repo=... status=... ms=...`)"),
    ("ASPEN_CGI_RESIDENT", "cgi_resident", SWITCH, True, "`1`", None,
     "aspen-cgi hands a request no recorded answer serves to a resident Aspen process of the same user "
     "(started on first need, one per machine and install) instead of importing the pipeline itself"),
    ("ASPEN_CGI_RESIDENT_IDLE", "cgi_resident_idle", SECONDS, 300.0, "`300`", None,
     "a resident process with no request for this long exits"),
    ("ASPEN_CGI_RESIDENT_WORKERS", "cgi_resident_workers", COUNT, 32, "`32`", None,
     "requests the resident answers at once (a worker process each); past them, aspen-cgi answers "
     "in-process"),
    ("ASPEN_METRICS", "metrics", SWITCH, False, "`0`", None,
     "count every response and serve `GET /_aspen/metrics` (Prometheus text format)"),
    ("ASPEN_REMOTE_USER_HEADER", "remote_user_header", HEADER, None, "unset", None,
     "WSGI only: REMOTE_USER comes from this request header, set by an authenticating proxy, and from "
     "nowhere else"),
    ("ASPEN_REFSTORE", "refstore", SWITCH, True, "`1`", None,
     "keep the ref store; `0`: serve refs straight from the disk"),
    ("ASPEN_STORE_WAIT", "store_wait", SECONDS, 30.0, "`30`", None,
     "how long a push waits for a ref store another process holds locked (then git writes the refs alone)"),
    ("ASPEN_REFSTORE_URL", "refstore_url", DB_URL, None, "unset: a SQLite file in each repository's state",
     None, "keep every repository's ref store in this PostgreSQL database (one schema each; "
     "docs/cluster.md), not in SQLite files; needs the `cluster` extra (psycopg)"),
    ("ASPEN_REFSTORE_POOL", "refstore_pool", COUNT, 4, "`4`", None,
     "connections to that database per server process (its pool's most)"),
    ("ASPEN_CLUSTER", "cluster", NAME, None, "unset", None,
     "the name of the tree of repositories this server serves with others from one ASPEN_REFSTORE_URL: "
     "a store is known by this name and the repository's path under GIT_PROJECT_ROOT, the same on every "
     "node; unset: by the repository's absolute path"),
    ("ASPEN_PACK_STORE", "pack_store", PATH, None, "unset: no replicas", None,
     "with ASPEN_REFSTORE_URL: a directory on shared storage that every node reads; each push's objects "
     "are kept there (write-once packs named by their trailer) before it is acknowledged, and this node "
     "is a replica that catches up from the log before it answers (docs/cluster.md)"),
    ("ASPEN_NODE_URL", "node_url", HTTP_URL, None, "unset", None,
     "with ASPEN_REFSTORE_URL and no ASPEN_PACK_STORE: this node's address as the cluster's other nodes "
     "reach it (its application's root); each node keeps the packs on its own disk, sends each push's pack "
     "to other nodes before the push is acknowledged, and fetches what it lacks from them (docs/cluster.md)"),
    ("ASPEN_CLUSTER_SECRET", "cluster_secret", SECRET, None, "unset", None,
     "with ASPEN_NODE_URL: the secret every node of the cluster shares; a request between nodes carries a "
     "signature made with it, and one without is refused (403)"),
    ("ASPEN_REPLICAS", "replicas", COUNT, 2, "`2`", None,
     "with ASPEN_NODE_URL: on how many nodes a push's pack is kept before the push is acknowledged (at most "
     "the number of nodes the cluster has)"),
    # poll files (nginx answers pollers from them: docs/polls.md)
    ("ASPEN_POLL_DIR", "poll_dir", PATH, None, "unset: `<ASPEN_RUN_DIR>/polls`", None,
     "keep each repository's current upload-pack advertisements (v0, v2) here as files, by URL, for nginx "
     "to answer `info/refs` polls from (nginx/aspen.conf)"),
    ("ASPEN_POLL_WINDOW", "poll_window", COUNT0, 1, "`1`", None,
     "a poll file is served for this many seconds after Aspen last checked what the advertisement is made "
     "of, then Aspen answers the next poll and writes it again (a change Aspen does not make, e.g. a "
     "`git update-ref` on the server, shows within this long; a push through Aspen at once); `0`: no "
     "poll files"),
    ("ASPEN_POLL_LOG", "poll_log", PATH, None, "unset", "a file",
     "nginx's log of the polls it answered from poll files (nginx/aspen.conf: two bytes a poll), counted "
     "as `aspen_polls_from_files_total` in the metrics"),
    # limits
    ("ASPEN_MAX_PUSH_BYTES", "max_push_bytes", SIZE, 0, "`0` (unlimited)", None,
     "a push's request body, raw and inflated: over it, `413`, no ref changes"),
    ("ASPEN_IDLE_TIMEOUT", "idle_timeout", SECONDS, 60.0, "`60`", None,
     "no byte from the client, or the client taking no answer bytes, for this long ends the request; "
     "`0`: none"),
    ("ASPEN_REQUEST_TIMEOUT", "request_timeout", SECONDS, 3600.0, "`3600`", None,
     "wall clock per request; `0`: none"),
    # the response cache, depth-1 clones and pre-warm
    ("ASPEN_CACHE", "cache", SWITCH, True, "`1`", None, "the response cache of upload-pack answers"),
    ("ASPEN_CACHE_DIR", "cache_dir", PATH, None, "unset: `cache/` in each repository's state", None,
     "one cache directory shared by all repositories (and one size bound)"),
    ("ASPEN_CACHE_MAX_BYTES", "cache_max_bytes", SIZE, 1 << 30, "`1g`", None,
     "the cache's entries on disk, per cache directory: past it, superseded then least recently used "
     "entries go"),
    ("ASPEN_CACHE_RESERVE_BYTES", "cache_reserve_bytes", SIZE, 64 << 20, "`64m`", None,
     "with less free disk space than this, no cache entry is started"),
    ("ASPEN_WIDE_DEPTH1", "wide_depth1", SWITCH, True, "`1`", None,
     "after git answers a depth-1 clone, build a smaller answer in the background for the clones after"),
    ("ASPEN_DEPTH1_WINDOW", "depth1_window", COUNT0, 50, "`50`", None,
     "the delta search window of those smaller depth-1 answers (git's own is 10)"),
    ("ASPEN_PREWARM", "prewarm", _PREWARM, "default", "`default`", "`default`, `all`, `off`",
     "after a push, compute the depth-1 clone answers of HEAD's branch (`default`), of every branch it "
     "moved (`all`), or none"),
    ("ASPEN_PREWARM_DEMAND_S", "prewarm_demand", ANY_SECONDS, 86400.0, "`86400`", None,
     "pre-warm only repositories whose depth-1 clones were asked for within this long (negative: none); "
     "keep bundles current only where bundles were"),
    # admission
    ("ASPEN_COLD_PER_REPO", "cold_per_repo", COUNT, _cores, "the number of cores", None,
     "git upload-pack runs at once per repository (the rest queue)"),
    ("ASPEN_COLD_PER_SERVER", "cold_per_server", COUNT, lambda: 2 * _cores(), "twice the number of cores",
     None, "git upload-pack runs at once on the machine (the rest queue)"),
    ("ASPEN_QUEUE", "queue", COUNT0, 1024, "`1024`", None,
     "fetches waiting for an upload-pack slot; past it, `503` with Retry-After"),
    ("ASPEN_QUEUE_WAIT", "queue_wait", SECONDS, 300.0, "`300`", None,
     "how long a queued fetch waits for its slot before `503`"),
    ("ASPEN_RETRY_AFTER", "retry_after", COUNT, 5, "`5`", None, "the `Retry-After` seconds of those `503`s"),
    ("ASPEN_CLIENT_SHARE", "client_share", PERCENT, 50, "`50`", None,
     "the share of those upload-pack slots (per repository and per machine) and of the queue one client may "
     "hold; past its share of the slots a client waits (it may still take a slot while at least one other "
     "stays free), past its share of the queue it gets `503` with Retry-After; `100`: no share "
     "(docs/cache.md)"),
    ("ASPEN_TRUSTED_PROXIES", "trusted_proxies", PROXIES, (), "unset: none", None,
     "the proxies whose `X-Forwarded-For` names the client (for ASPEN_CLIENT_SHARE); from any other peer the "
     "header is ignored and the client is the peer's address"),
    ("ASPEN_BUILDS_PER_SERVER", "builds_per_server", COUNT, lambda: max(1, _cores() // 2),
     "half the cores (at least 1)", None,
     "version, segment and depth-1 pack builds at once on the machine (background and `aspen import`)"),
    # stored packs
    ("ASPEN_VERSION_PACKS", "version_packs", _VERSION_PACKS, "auto", "`auto`",
     "`auto`, `off` (or a boolean)",
     "build a pack for every version after it lands, and answer fetches from stored packs; `off`: no pack "
     "is built or kept from a push, so git answers every fetch that needs a version landed since (one "
     "whose versions all have packs built before is still answered from them)"),
    ("ASPEN_BUILD_WAIT_MS", "build_wait", MILLISECONDS, 0.05, "`50`", None,
     "the most a fetch waits for its versions' packs, and only when each is made in milliseconds (a client's"
     " pack adopted, no git run); never for a pack git must build: git answers at once; `0`: never waits"),
    # what the edge carries (fetch/offload.py)
    ("ASPEN_OFFLOAD", "offload", SWITCH, True, "`1`", None,
     "protocol v2 fetches whose client offers `packfile-uris` (git's `fetch.uriProtocols`) get the stored "
     "import pack by URI (`<repo>/aspen/pack/pack-<name>.pack`, or ASPEN_OFFLOAD_URL's) instead of inline; "
     "the rest comes inline"),
    ("ASPEN_OFFLOAD_URL", "offload_url", HTTP_URL, None, "unset: Aspen's own route", None,
     "the base URL the packs go by instead of this server's (nginx or a CDN serving `aspen/packs/` from disk: "
     "nginx/aspen-offload.conf); a pack's URL is this, the repository's path, `/aspen/pack/pack-<name>.pack`"),
    ("ASPEN_OFFLOAD_MIN_BYTES", "offload_min_bytes", SIZE, 1 << 20, "`1m`", None,
     "a stored pack smaller than this goes inline"),
    ("ASPEN_BUNDLE_URI", "bundle_uri", SWITCH, True, "`1`", None,
     "advertise `bundle-uri` in protocol v2 and answer it with the bundle of the repository at its last "
     "compaction (`<repo>/aspen/bundle@V`; git >= 2.40 clients with `transfer.bundleURI=true` ask)"),
    ("ASPEN_COMPACT_QUIET_MS", "compact_quiet", MILLISECONDS, 1.0, "`1000`", None,
     "how long a repository must go without a new version before its segment packs are built and its depth-1"
     " clones pre-warmed"),
)

# Read by the code but not the operator's to set: test hooks, and what Aspen passes to the programs it
# starts. Kept out of docs/settings.md and never parsed here.
INTERNAL = (
    ("ASPEN_GIT", "tests: the git program to run (read once, from the process environment)"),
    ("ASPEN_FAULT", "tests: the fault point at which a writer kills itself (runtime/owners.py)"),
    ("ASPEN_FAULT_ONCE", "tests: only while this file exists (removed first)"),
    ("ASPEN_NO_CLIENT", "pre-warm's requests: nobody waits for the answer (fetch/depth1.py)"),
    ("ASPEN_PREWARM_GITDIR", "the repository a detached pre-warmer warms (fetch/prewarm.py)"),
    ("ASPEN_BUNDLE_GITDIR", "the repository a detached bundle keeper keeps (fetch/bundlekeep.py)"),
    ("ASPEN_DEPTH1_GITDIR", "a detached depth-1 build's repository (fetch/depth1.py)"),
    ("ASPEN_DEPTH1_NAME", "a detached depth-1 build's cache entry"),
    ("ASPEN_DEPTH1_VERSION", "a detached depth-1 build's ref-store version"),
    ("ASPEN_DEPTH1_REQUEST", "a detached depth-1 build's request file"),
)

NAMES = tuple(row[0] for row in TABLE)
_LOOKUP = tuple((row[0], row[0].encode()) for row in TABLE)
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class SettingsError(ValueError):
    """Values that cannot be parsed: PROBLEMS is [(name, value, what is accepted)]."""

    def __init__(self, problems: list):
        self.problems = problems
        super().__init__("; ".join(f"aspen: bad setting {name}={value!r}: expected {accepted}"
                                   for name, value, accepted in problems))


class Settings:
    """The typed settings of one environment: one attribute per TABLE row (its
    second column), each the parsed value or the default."""
    __slots__ = tuple(row[1] for row in TABLE)
    if TYPE_CHECKING:                       # what mypy knows of each row's attribute
        state_dir: Optional[str]
        run_dir: str
        access_log: bool
        cgi_resident: bool
        cgi_resident_idle: float
        cgi_resident_workers: int
        metrics: bool
        remote_user_header: Optional[str]
        refstore: bool
        store_wait: float
        refstore_url: Optional[str]
        refstore_pool: int
        cluster: Optional[str]
        pack_store: Optional[str]
        node_url: Optional[str]
        cluster_secret: Optional[str]
        replicas: int
        max_push_bytes: int
        idle_timeout: float
        request_timeout: float
        cache: bool
        cache_dir: Optional[str]
        cache_max_bytes: int
        cache_reserve_bytes: int
        wide_depth1: bool
        depth1_window: int
        prewarm: str
        prewarm_demand: float
        cold_per_repo: int
        cold_per_server: int
        queue: int
        queue_wait: float
        retry_after: int
        builds_per_server: int
        version_packs: str
        build_wait: float
        compact_quiet: float
        poll_dir: Optional[str]
        poll_window: int
        poll_log: Optional[str]
        client_share: int
        trusted_proxies: tuple
        offload: bool
        offload_url: Optional[str]
        offload_min_bytes: int
        bundle_uri: bool

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{a}={getattr(self, a)!r}" for a in self.__slots__) + ")"


def default(name: str):
    """NAME's default value (in seconds for a duration)."""
    row = TABLE[NAMES.index(name)]
    return row[3]() if callable(row[3]) else row[3]


def accepted(row: tuple) -> str:
    """What ROW's setting accepts, as docs/settings.md shows it."""
    if row[5] is not None:
        return row[5]
    return ACCEPTED[row[2]]


def _parse(kind, text: str):
    """TEXT (stripped, non-empty) as KIND; ValueError when it is not one."""
    if kind is SWITCH:
        return parse_bool(text)
    if kind is SIZE:
        return parse_size(text)
    if kind is SECONDS or kind is ANY_SECONDS or kind is MILLISECONDS:
        value = float(text)
        if value - value != 0:                  # inf, nan
            raise ValueError(text)
        if kind is not ANY_SECONDS and value < 0:
            raise ValueError(text)
        return value / 1000 if kind is MILLISECONDS else value
    if kind is COUNT or kind is COUNT0:
        if not text.isdigit():
            raise ValueError(text)
        value = int(text)
        if value < (1 if kind is COUNT else 0):
            raise ValueError(text)
        return value
    if kind is PATH:
        return text
    if kind is HEADER:
        if not all(c in _TOKEN for c in text):
            raise ValueError(text)
        return text
    if kind is NAME:
        if not text or not all(c.isascii() and (c.isalnum() or c in "-._") for c in text):
            raise ValueError(text)
        return text
    if kind is DB_URL:
        if not (text.startswith("postgresql://") or text.startswith("postgres://")):
            raise ValueError(text)
        return text
    if kind is HTTP_URL:
        if not (text.startswith("http://") or text.startswith("https://")) or len(text.split("/")) < 3 \
                or not text.split("/")[2] or any(c.isspace() for c in text):
            raise ValueError(text)
        return text.rstrip("/")
    if kind is SECRET:
        if len(text) < 16:
            raise ValueError("(hidden)")
        return text
    if kind is PERCENT:
        if not text.isdigit() or not 1 <= int(text) <= 100:
            raise ValueError(text)
        return int(text)
    if kind is PROXIES:
        return _proxies(text)
    return kind[text.lower()]                   # a mode: KeyError is a LookupError, not a ValueError


def _proxies(text: str) -> tuple:
    """ASPEN_TRUSTED_PROXIES: each item an ipaddress network (an address is its /32 or /128), or `unix`."""
    import ipaddress  # startup: only where the setting is set
    out: list = []
    for item in text.replace(",", " ").split():
        if item.lower() == "unix":
            out.append("unix")
        else:
            out.append(ipaddress.ip_network(item, strict=False))
    if not out:
        raise ValueError(text)
    return tuple(out)


def parse(values) -> Settings:
    """Settings from VALUES, each TABLE row's raw value in order (None, '' or
    b'' for unset; bytes are the process environment's); SettingsError
    names every value that cannot be parsed."""
    s = Settings()
    problems = []
    for row, raw in zip(TABLE, values):
        if isinstance(raw, bytes):
            raw = raw.decode(sys.getfilesystemencoding(), "surrogateescape")      # os.fsdecode
        text = raw.strip() if raw else ""
        if not text:
            default = row[3]
            value = default() if callable(default) else default
        else:
            try:
                value = _parse(row[2], text)
            except (ValueError, LookupError, ConfigError):
                problems.append((row[0], "(hidden)" if row[2] is SECRET else raw, accepted(row).replace("`", "")))
                continue
        setattr(s, row[1], value)
    if not problems and s.pack_store and not s.refstore_url:
        problems.append(("ASPEN_PACK_STORE", s.pack_store, "a pack store with ASPEN_REFSTORE_URL set as well"))
    if not problems and s.node_url:
        if s.pack_store:
            problems.append(("ASPEN_NODE_URL", s.node_url, "either ASPEN_NODE_URL or ASPEN_PACK_STORE, not both"))
        elif not s.refstore_url or not s.cluster:
            problems.append(("ASPEN_NODE_URL", s.node_url, "a node's URL with ASPEN_REFSTORE_URL and "
                                                           "ASPEN_CLUSTER set as well"))
        elif not s.cluster_secret:
            problems.append(("ASPEN_NODE_URL", s.node_url, "a node's URL with ASPEN_CLUSTER_SECRET set as well"))
    if problems:
        raise SettingsError(problems)
    return s


# The body of the 500 a request whose settings cannot be parsed gets (the log says which).
REFUSED_BODY = b"aspen: this server's settings are invalid; its error log says which\n"

_cache: dict = {}
_CACHE_MAX = 256


def _raw(env: Optional[Mapping[str, str]]) -> tuple:
    """Each setting's raw value: ENV's if non-empty, else the process environment's.

    The process environment is read from posix.environ, the dictionary of
    bytes os.environ keeps up to date under it (os.environ.get() encodes the
    name and decodes the value: ~30 us a call, several calls a request; and
    the CGI program's first steps do not import os)."""
    proc = posix.environ.get
    if env is None or getattr(env, "_data", None) is posix.environ:
        return tuple([proc(b) for _, b in _LOOKUP])
    get = env.get
    return tuple([get(n) or proc(b) for n, b in _LOOKUP])


def of(env: Optional[Mapping[str, str]] = None) -> Settings:
    """The settings of a request's environment ENV (over the process
    environment; None: the process environment alone). Parsed once per
    distinct set of values; SettingsError when a value cannot be parsed."""
    key = _raw(env)
    s = _cache.get(key)
    if s is None:
        s = parse(key)
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = s
    return s


def forget() -> None:
    """Parse again on next use: defaults that depend on the user (ASPEN_RUN_DIR) after a switch of user."""
    _cache.clear()


# -- docs/settings.md --------------------------------------------------------------------------------

BEGIN = "<!-- the table is settings.TABLE: `python -m aspen_cgi.settings --write docs/settings.md` -->"
END = "<!-- end of the table -->"


def markdown() -> str:
    """The operator's table of docs/settings.md."""
    lines = ["| Setting | Default | Accepted | Meaning |", "|---|---|---|---|"]
    for row in TABLE:
        lines.append(f"| `{row[0]}` | {row[4]} | {accepted(row)} | {row[6]} |")
    return "\n".join(lines) + "\n"


def with_table(doc: str) -> str:
    """DOC with the text between BEGIN and END replaced by the table."""
    head, begin, rest = doc.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"no {BEGIN!r} ... {END!r} in the document")
    return head + begin + "\n" + markdown() + "\n" + end + tail


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        with open(sys.argv[2]) as f:
            text = f.read()
        with open(sys.argv[2], "w") as f:
            f.write(with_table(text))
    elif len(sys.argv) == 1:
        sys.stdout.write(markdown())
    else:
        sys.exit("usage: python -m aspen_cgi.settings [--write docs/settings.md]")

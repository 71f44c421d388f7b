"""Fairness between clients (runtime/admission.py, ASPEN_CLIENT_SHARE), end
to end: real git clients and raw HTTP requests against gunicorn and the CGI
program, computations held at a gate only for the client that storms.

What each case gets:
- a client holding its share of the slots: its next cold fetch waits, while
  another client's fetch goes straight through (gunicorn and CGI; the client
  by X-Forwarded-For from a trusted proxy, or by REMOTE_USER); with
  ASPEN_CLIENT_SHARE=100 the same storm takes the slot and the other waits.
- a client holding its share of the queue: `503` with Retry-After at once,
  its client named in the server's log, while another's fetch goes through.
- X-Forwarded-For: ignored unless the peer is a trusted proxy; read from the
  right end when it is; REMOTE_USER over both.
- the parsing of the client (http/client.py) and of ASPEN_TRUSTED_PROXIES.
"""

from __future__ import annotations

import http.client
import re
import shlex
import urllib.parse
from pathlib import Path

import pytest

from aspen_cgi import settings
from aspen_cgi.fetch.prewarm import clone_request
from aspen_cgi.http import client as clients
from aspen_cgi.model.client import ADDRESS, USER, Client
from aspen_cgi.runtime import admission

from .harness import fsck_strict, git, refs_of
from .test_cache import Gate, Threads, _locked, _tip, _wait, gate  # noqa: F401  (gate: a fixture)

STORMER = "10.0.0.1"
OTHER = "10.0.0.2"
# Counts every pack-objects run (one line: the client it ran for) and holds the stormer's while the gate is shut.
HOOK = """#!/bin/sh
who="${{REMOTE_USER:-$HTTP_X_FORWARDED_FOR}}"
echo "$who $(cut -d' ' -f19 /proc/$$/stat)" >> {counter}
if [ "$who" = "{stormer}" ] || [ "$who" = "alice" ]; then
  i=0
  while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
fi
exec "$@"
"""


def _env(tmp_path: Path, gate: Gate, **extra: str) -> dict[str, str]:
    counter = tmp_path / "computations"
    hook = tmp_path / "hook.sh"
    hook.write_text(HOOK.format(counter=shlex.quote(str(counter)), gate=shlex.quote(str(gate.path)),
                                stormer=STORMER))
    hook.chmod(0o755)
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "uploadpack.packObjectsHook", "GIT_CONFIG_VALUE_0": str(hook),
           "ASPEN_ACCESS_LOG": "1", "ASPEN_RUN_DIR": str(tmp_path / "run"), "ASPEN_CACHE": "off",
           "ASPEN_WIDE_DEPTH1": "0", "ASPEN_METRICS": "1", "ASPEN_STATE_DIR": str(tmp_path / "state"),
           "ASPEN_COLD_PER_REPO": "2", "ASPEN_COLD_PER_SERVER": "4", "ASPEN_QUEUE": "8"}
    env.update(extra)
    return env


def _runs(tmp_path: Path) -> list[tuple[str, int]]:
    """(the client, its pack-objects' niceness) of each computation, in order."""
    f = tmp_path / "computations"
    return [(who, int(nice)) for who, nice in (line.split() for line in f.read_text().splitlines())] \
        if f.exists() else []


def _computations(tmp_path: Path) -> list[str]:
    return [who for who, _ in _runs(tmp_path)]


def _headers(identity: str, who: str) -> dict[str, str]:
    if identity == "user":
        return {"X-Remote-User": who}
    return {"X-Forwarded-For": who}


def _git_header(identity: str, who: str) -> list[str]:
    name, value = next(iter(_headers(identity, who).items()))
    return ["-c", f"http.extraHeader={name}: {value}"]


def _conn(server, timeout: float) -> http.client.HTTPConnection:
    where = urllib.parse.urlsplit(server.url)
    return http.client.HTTPConnection(where.hostname, where.port, timeout=timeout)


def _post(server, body: bytes, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    """One v2 upload-pack POST, read to its end."""
    conn = _conn(server, 120)
    try:
        conn.request("POST", "/repo.git/git-upload-pack", body=body,
                     headers={"Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2",
                              **headers})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _clone(url: str, dest: Path, server_repo: Path, header: list[str], *args: str) -> None:
    """A real `git clone`, checked: fsck --strict and its refs the server's."""
    git(*header, "clone", "-q", *args, url, str(dest))
    fsck_strict(str(dest))
    theirs = refs_of(str(server_repo))
    for name, oid in refs_of(str(dest)).items():
        if name.startswith("refs/remotes/origin/") and not name.endswith("/HEAD"):
            assert theirs["refs/heads/" + name[len("refs/remotes/origin/"):]] == oid


def _access(server, who: str) -> list[str]:
    """The upload-pack POST access lines admission counted to WHO (a client label)."""
    return [line for line in server.log_text().splitlines()
            if "service=upload-pack" in line and "method=POST" in line and f" client={who} " in line]


def _metric(server, name: str) -> float:
    conn = _conn(server, 30)
    try:
        conn.request("GET", "/_aspen/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, text
    return float(m.group(1))


def _body(tip: str, i: int) -> bytes:
    """A depth-1 clone request, made distinct by its depth (a cold computation each)."""
    return clone_request([tip, tip]).replace(b"deepen 1", f"deepen {i + 1}".encode())


def _queue_file(tmp_path: Path, client: Client, i: int = 0) -> Path:
    return tmp_path / "run" / admission.CLIENTS / f"{client.tag}.queue.{i}"


SETUPS = [("gunicorn", "forwarded"), ("gunicorn", "user"), ("cgi", "forwarded")]


@pytest.mark.parametrize("kind,identity", SETUPS, ids=[f"{k}-{i}" for k, i in SETUPS])
def test_a_client_past_its_share_waits_while_another_goes_straight_through(
        kind, identity, root, server_factory, cgi_server_factory, tmp_path, gate):
    """ASPEN_CLIENT_SHARE=50 (the default) of 2 slots per repository: the
    stormer's first cold fetch runs (held at the gate), its second waits
    although a slot is free (it would take the last one), and the other
    client's real `git clone --depth 1` takes that slot and ends while both
    of the stormer's are still held. Then the stormer's second runs."""
    env = _env(tmp_path, gate, ASPEN_TRUSTED_PROXIES="127.0.0.1",
               **({"ASPEN_REMOTE_USER_HEADER": "X-Remote-User"} if identity == "user" else {}))
    server = server_factory(root, **env) if kind == "gunicorn" else cgi_server_factory(root, "aspen", **env)
    stormer, other = (("alice", "bob") if identity == "user" else (STORMER, OTHER))
    stormer_id = Client(USER, stormer) if identity == "user" else Client(ADDRESS, stormer)
    tip = _tip(root / "repo.git")
    runs = Threads()
    try:
        runs.start("first", _post, server, _body(tip, 0), _headers(identity, stormer))
        _wait("the stormer's first computation", lambda: runs.errors or len(_computations(tmp_path)) == 1,
              state=lambda: str(runs.errors))
        runs.start("second", _post, server, _body(tip, 1), _headers(identity, stormer))
        _wait("the stormer's second request to wait in its share of the queue",
              lambda: runs.errors or _locked(_queue_file(tmp_path, stormer_id)), state=lambda: str(runs.errors))
        assert runs.errors == []
        _clone(f"{server.url}/repo.git", tmp_path / "other", root / "repo.git", _git_header(identity, other),
               "--depth", "1")
        assert runs.threads["first"].is_alive() and runs.threads["second"].is_alive()
        assert _locked(_queue_file(tmp_path, stormer_id)), "the stormer's second still waits"
        assert _computations(tmp_path) == [stormer, other]
        label = Client(USER, other).label if identity == "user" else Client(ADDRESS, other).label
        lines = _access(server, label)
        assert len(lines) == 1 and "queued_ms=" not in lines[0], lines
    finally:
        gate.open()
    runs.join(60)
    assert runs.results["first"][0] == 200 and runs.results["second"][0] == 200
    assert _computations(tmp_path) == [stormer, other, stormer]
    # a response's access line is written as it closes, which may be just after its client read the end
    _wait("the stormer's two access lines", lambda: len(_access(server, stormer_id.label)) == 2)
    waited = [line for line in _access(server, stormer_id.label) if "over_share=waited" in line]
    assert len(waited) == 1 and "queued_ms=" in waited[0], server.log_text()[-3000:]
    if kind == "gunicorn":          # the CGI server's requests count in one run directory as well: gunicorn's suffice
        assert _metric(server, "aspen_admission_client_waits_total") == 1
        assert _metric(server, "aspen_admission_client_rejected_total") == 0


def test_with_no_share_the_storm_takes_every_slot_and_the_other_waits(root, server_factory, tmp_path, gate):
    """The same storm with ASPEN_CLIENT_SHARE=100: the stormer's second
    fetch takes the repository's last slot, and the other client's fetch
    waits until the gate opens (what the share above prevents)."""
    server = server_factory(root, **_env(tmp_path, gate, ASPEN_TRUSTED_PROXIES="127.0.0.1", ASPEN_CLIENT_SHARE="100"))
    tip = _tip(root / "repo.git")
    runs = Threads()
    try:
        runs.start("first", _post, server, _body(tip, 0), _headers("forwarded", STORMER))
        runs.start("second", _post, server, _body(tip, 1), _headers("forwarded", STORMER))
        _wait("both of the stormer's computations", lambda: runs.errors or len(_computations(tmp_path)) == 2,
              state=lambda: str(runs.errors))
        runs.start("other", _post, server, _body(tip, 2), _headers("forwarded", OTHER))
        _wait("the other client to wait in the queue",
              lambda: runs.errors or any(_locked(tmp_path / "run" / f"queue.{i}") for i in range(8)),
              state=lambda: str(runs.errors))
        assert _computations(tmp_path) == [STORMER, STORMER]
        assert runs.threads["other"].is_alive()
    finally:
        gate.open()
    runs.join(60)
    assert [runs.results[n][0] for n in ("first", "second", "other")] == [200, 200, 200]
    assert not (tmp_path / "run" / admission.CLIENTS).exists(), "no share: no client files"


def test_a_client_past_its_share_of_the_queue_gets_503_while_another_goes_through(
        root, server_factory, tmp_path, gate):
    """ASPEN_QUEUE=2: a client's share is one queue place. The stormer's
    first fetch runs, its second waits in its one place, its third is
    refused at once with 503 and Retry-After (the queue has room for
    others), and the log names the client; the other client's clone goes
    through meanwhile."""
    server = server_factory(root, **_env(tmp_path, gate, ASPEN_TRUSTED_PROXIES="127.0.0.1", ASPEN_QUEUE="2"))
    tip = _tip(root / "repo.git")
    stormer = Client(ADDRESS, STORMER)
    runs = Threads()
    try:
        runs.start("first", _post, server, _body(tip, 0), _headers("forwarded", STORMER))
        _wait("the stormer's first computation", lambda: runs.errors or len(_computations(tmp_path)) == 1)
        runs.start("second", _post, server, _body(tip, 1), _headers("forwarded", STORMER))
        _wait("the stormer's second to wait", lambda: runs.errors or _locked(_queue_file(tmp_path, stormer)))
        status, headers, body = _post(server, _body(tip, 2), _headers("forwarded", STORMER))
        assert status == 503 and headers.get("Retry-After") == "5"
        assert b"retry" in body.lower() and b"Traceback" not in body
        _clone(f"{server.url}/repo.git", tmp_path / "other", root / "repo.git", _git_header("forwarded", OTHER),
               "--depth", "1")
        assert runs.threads["second"].is_alive()
    finally:
        gate.open()
    runs.join(60)
    assert runs.results["first"][0] == 200 and runs.results["second"][0] == 200
    _wait("the stormer's three access lines", lambda: len(_access(server, stormer.label)) == 3)
    log = server.log_text()
    assert re.search(r"aspen: client holds its share of the queue \(client addr:10\.0\.0\.1, "
                     r"ASPEN_CLIENT_SHARE=50%\); retry after 5 s", log), log[-3000:]
    refused = [line for line in _access(server, stormer.label) if "status=503" in line]
    assert len(refused) == 1 and "over_share=refused" in refused[0] and "cache=overloaded" in refused[0]
    assert _metric(server, "aspen_admission_client_rejected_total") == 1
    assert _metric(server, "aspen_admission_rejected_total") == 1
    assert list((tmp_path / "run" / admission.CLIENTS).iterdir()) == [], "a client holding nothing leaves no file"


def test_x_forwarded_for_is_read_only_from_a_trusted_proxy(root, server_factory, tmp_path, gate):
    """The same real fetch with `X-Forwarded-For: 10.9.9.9, 10.0.0.2` counts
    as 127.0.0.1 (the peer) without ASPEN_TRUSTED_PROXIES, as 10.0.0.2 (the
    rightmost untrusted hop: the first one a trusted proxy wrote) with it,
    and as the user when REMOTE_USER is set, whatever the header says."""
    gate.open()
    seen = {}
    for name, extra in (("untrusted", {}), ("trusted", {"ASPEN_TRUSTED_PROXIES": "127.0.0.1"}),
                        ("user", {"ASPEN_TRUSTED_PROXIES": "127.0.0.1", "ASPEN_REMOTE_USER_HEADER": "X-Remote-User"})):
        server = server_factory(root, **_env(tmp_path, gate, **extra))
        header = ["-c", "http.extraHeader=X-Forwarded-For: 10.9.9.9, 10.0.0.2"]
        if name == "user":
            header += ["-c", "http.extraHeader=X-Remote-User: carol"]
        _clone(f"{server.url}/repo.git", tmp_path / name, root / "repo.git", header, "--depth", "1")
        lines = [line for line in server.log_text().splitlines() if "service=upload-pack" in line and "method=POST"
                 in line and " client=" in line]             # the fetch (not its ls-refs: no admission)
        assert len(lines) == 1, lines
        seen[name] = re.search(r" client=(\S+) ", lines[0]).group(1)
        server.stop()
    assert seen == {"untrusted": "addr:127.0.0.1", "trusted": "addr:10.0.0.2", "user": "user:carol"}


# --- the parsing -------------------------------------------------------------------------------------

def _of(env: dict, proxies: str = "") -> Client:
    s = settings.of({"ASPEN_TRUSTED_PROXIES": proxies} if proxies else {})
    return clients.of(env, s)


def test_the_client_of_a_request():
    xff = {"REMOTE_ADDR": "192.0.2.1", "HTTP_X_FORWARDED_FOR": "198.51.100.7"}
    assert _of(xff) == Client(ADDRESS, "192.0.2.1")                              # no trusted proxy: ignored
    assert _of(xff, "192.0.2.0/24") == Client(ADDRESS, "198.51.100.7")
    assert _of(xff, "192.0.2.2") == Client(ADDRESS, "192.0.2.1")                 # another peer: ignored
    assert _of(dict(xff, REMOTE_USER="dave"), "192.0.2.1") == Client(USER, "dave")
    # read from the right: the first hop that is not a trusted proxy; a client's own entries to its left ignored
    chain = {"REMOTE_ADDR": "10.1.1.1", "HTTP_X_FORWARDED_FOR": "1.2.3.4, 203.0.113.9, 10.1.1.2"}
    assert _of(chain, "10.0.0.0/8") == Client(ADDRESS, "203.0.113.9")
    assert _of(dict(chain, HTTP_X_FORWARDED_FOR="10.1.1.3, 10.1.1.2"), "10.0.0.0/8") == Client(ADDRESS, "10.1.1.3")
    # an entry that is not an address ends the walk at the hop that wrote it
    assert _of(dict(chain, HTTP_X_FORWARDED_FOR="203.0.113.9, junk, 10.1.1.2"), "10.0.0.0/8") == \
        Client(ADDRESS, "10.1.1.2")
    assert _of(dict(chain, HTTP_X_FORWARDED_FOR="198.51.100.1:4711"), "10.0.0.0/8") == Client(ADDRESS, "198.51.100.1")
    # a unix socket's peer has no address: trusted only as `unix`
    sock = {"REMOTE_ADDR": "", "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    assert _of(sock) == Client(ADDRESS, "-")
    assert _of(sock, "unix") == Client(ADDRESS, "203.0.113.9")
    assert _of({}, "unix") == Client(ADDRESS, "-")
    # IPv6 by its /64; IPv4-mapped as IPv4
    assert _of({"REMOTE_ADDR": "2001:db8:1:2:3:4:5:6"}) == Client(ADDRESS, "2001:db8:1:2::/64")
    assert _of({"REMOTE_ADDR": "::ffff:192.0.2.5"}) == Client(ADDRESS, "192.0.2.5")
    assert _of({"REMOTE_ADDR": "[2001:db8::1]", "HTTP_X_FORWARDED_FOR": "[2001:db8:9::1]:443"}, "2001:db8::/64") == \
        Client(ADDRESS, "2001:db8:9::/64")
    assert _of({"REMOTE_ADDR": "not-an-address"}) == Client(ADDRESS, "not-an-address")
    # labels and tags
    assert Client(ADDRESS, "10.0.0.1").label == "addr:10.0.0.1" and Client(USER, "a").label == "user:a"
    assert len(Client(ADDRESS, "10.0.0.1").tag) == 16 and Client(ADDRESS, "a").tag != Client(USER, "a").tag


def test_the_settings_of_fairness():
    s = settings.of({})
    assert s.client_share == 50 and s.trusted_proxies == ()
    s = settings.of({"ASPEN_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8 unix ::1", "ASPEN_CLIENT_SHARE": "100"})
    assert [str(p) for p in s.trusted_proxies] == ["127.0.0.1/32", "10.0.0.0/8", "unix", "::1/128"]
    assert s.client_share == 100
    for name, value in (("ASPEN_CLIENT_SHARE", "0"), ("ASPEN_CLIENT_SHARE", "101"), ("ASPEN_CLIENT_SHARE", "half"),
                        ("ASPEN_TRUSTED_PROXIES", "10.0.0.0/33"), ("ASPEN_TRUSTED_PROXIES", "nginx"),
                        ("ASPEN_TRUSTED_PROXIES", ",")):
        with pytest.raises(settings.SettingsError, match=name):
            settings.of({name: value})
    lim = admission.capacity(settings.of({"ASPEN_COLD_PER_REPO": "2", "ASPEN_COLD_PER_SERVER": "5",
                                          "ASPEN_QUEUE": "3"}))
    assert lim.shares() == (1, 2, 1)
    assert admission.capacity(settings.of({"ASPEN_COLD_PER_REPO": "1", "ASPEN_QUEUE": "0"})).shares()[::2] == (1, 0)


def test_one_slot_free_is_left_for_a_client_within_its_share(tmp_path):
    """In one process, as every process sees them: a client holding its
    share takes more only while one slot stays free; the last goes to
    another client; a client that gives its slots back leaves no file."""
    lim = admission.capacity(settings.of({"ASPEN_RUN_DIR": str(tmp_path / "run"), "ASPEN_COLD_PER_REPO": "4",
                                          "ASPEN_COLD_PER_SERVER": "8", "ASPEN_QUEUE": "0"}))
    repo = str(tmp_path)
    a, b, c = Client(ADDRESS, "10.0.0.1"), Client(ADDRESS, "10.0.0.2"), Client(ADDRESS, "10.0.0.3")
    held = [admission.acquire(lim, repo, client=a) for _ in range(3)]     # 2 within the share, 1 borrowed
    with pytest.raises(admission.Overloaded) as e:
        admission.acquire(lim, repo, client=a)                             # would take the last: refused (no queue)
    assert e.value.why == "queue full"
    held.append(admission.acquire(lim, repo, client=b))                    # the last one
    with pytest.raises(admission.Overloaded):
        admission.acquire(lim, repo, client=c)
    assert admission.gauges(lim).running == 4
    for slot in held:
        slot.release()
    assert list((tmp_path / "run" / admission.CLIENTS).iterdir()) == []
    assert admission.acquire(lim, repo, client=None).held                  # no client: no share


def test_a_clients_further_computations_run_behind_the_first_of_others(tmp_path):
    """A client's first computation on the machine runs at the server's
    priority; one it takes while holding another is `behind` (its git
    BEHIND_NICE nicer), within its share or past it; another client's first
    is not; given back, the client's next one is first again."""
    lim = admission.capacity(settings.of({"ASPEN_RUN_DIR": str(tmp_path / "run"), "ASPEN_COLD_PER_REPO": "4",
                                          "ASPEN_COLD_PER_SERVER": "8", "ASPEN_QUEUE": "0"}))
    repo = str(tmp_path)
    a, b = Client(ADDRESS, "10.0.0.1"), Client(ADDRESS, "10.0.0.2")
    mine = [admission.acquire(lim, repo, client=a) for _ in range(3)]     # 2 within the share, 1 borrowed
    other = admission.acquire(lim, repo, client=b)
    assert [s.behind for s in mine] == [False, True, True] and not other.behind
    for slot in mine:
        slot.release()
    again = admission.acquire(lim, repo, client=a)
    assert not again.behind
    assert not admission.acquire(lim, repo, client=None).behind            # no client: no share, no order


def test_a_client_with_requests_waiting_computes_behind_others(tmp_path):
    """A client that has other requests waiting in the queue (a farm that
    sent many) runs even its first computation behind; one with none does not."""
    lim = admission.capacity(settings.of({"ASPEN_RUN_DIR": str(tmp_path / "run"), "ASPEN_COLD_PER_REPO": "4",
                                          "ASPEN_COLD_PER_SERVER": "8", "ASPEN_QUEUE": "4"}))
    repo = str(tmp_path)
    a, b = Client(ADDRESS, "10.0.0.1"), Client(ADDRESS, "10.0.0.2")
    assert admission.acquire(lim, repo, client=b) is not None
    (tmp_path / "run" / admission.CLIENTS).mkdir(exist_ok=True)
    waiting = admission._take_client(str(_queue_file(tmp_path, a))[:-2], lim.shares()[2])   # a's request in line
    assert waiting is not None
    assert admission.acquire(lim, repo, client=a).behind
    admission._give_back([waiting])
    c = Client(ADDRESS, "10.0.0.3")
    assert not admission.acquire(lim, repo, client=c).behind


def test_a_stormers_second_computation_runs_nicer_than_the_other_clients(root, server_factory, tmp_path, gate):
    """Through gunicorn, 3 slots: the stormer's two cold fetches run at once
    (both held at the gate), the second's pack-objects BEHIND_NICE nicer than
    the first's and than the other client's, which runs meanwhile; the
    access line of the second says `behind=`."""
    server = server_factory(root, **_env(tmp_path, gate, ASPEN_TRUSTED_PROXIES="127.0.0.1",
                                         ASPEN_COLD_PER_REPO="3", ASPEN_COLD_PER_SERVER="3"))
    tip = _tip(root / "repo.git")
    runs = Threads()
    try:
        for i in range(2):
            runs.start(f"storm{i}", _post, server, _body(tip, i), _headers("forwarded", STORMER))
            _wait(f"the stormer's computation {i + 1}", lambda i=i: runs.errors or len(_runs(tmp_path)) == i + 1,
                  state=lambda: str(runs.errors))
        status, _, _ = _post(server, _body(tip, 5), _headers("forwarded", OTHER))
        assert status == 200 and runs.errors == []
    finally:
        gate.open()
    runs.join(60)
    got = _runs(tmp_path)
    assert [who for who, _ in got] == [STORMER, STORMER, OTHER]
    first, second, other = (nice for _, nice in got)
    assert first == other and second == first + admission.BEHIND_NICE, got
    _wait("the stormer's two access lines", lambda: len(_access(server, f"addr:{STORMER}")) == 2)
    assert len([x for x in _access(server, f"addr:{STORMER}") if " behind=10" in x]) == 1
    assert not [x for x in _access(server, f"addr:{OTHER}") if " behind=" in x]

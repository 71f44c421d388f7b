"""What a service (fetch/, push/) is handed and hands back, below the HTTP
layer that builds it: the repository, its configuration, the environment
git children and hooks get (stock's run_service() environment), the
protocol version; a refusal with an HTTP status; a body that is a file.
http/backend.py builds a ServiceContext per request; pre-warm
(fetch/prewarm.py) builds one for a repository directly."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Mapping, Optional

from .git import gitexec
from .git.repoconfig import ConfigError, RepoConfig
from .model.client import Client
from .model.trace import Trace
from .runtime.repository import Repository
from .settings import Settings

if TYPE_CHECKING:
    from .model.refs import RefSnapshot

CHUNK = 65536


@dataclass(frozen=True)
class Repo:
    path: str        # the path as stock names it in messages (validated path)
    gitdir: str      # the git directory on disk
    bare: bool


@dataclass(frozen=True)
class RequestInfo:
    """Who asks, from where, in which namespace and protocol version: read
    once from the request's environment where the request is composed."""
    user: Optional[str]             # REMOTE_USER: None when the server did not authenticate
    address: Optional[str]          # REMOTE_ADDR
    namespace: Optional[str]        # GIT_NAMESPACE
    protocol: int                   # GIT_PROTOCOL's version (0 when none)
    client: Optional[Client] = None     # who counts for admission's per-client share (http/client.py); None:
                                        # no client waits (pre-warm), no share applies
    url: Optional[str] = None       # the repository's URL as the client reached it (http/backend.py)
    url_path: str = ""              # ...its path under the application (no SCRIPT_NAME)

    @classmethod
    def of(cls, env: Mapping[str, str], protocol: Optional[int] = None,
           client: Optional[Client] = None) -> "RequestInfo":
        return cls(env.get("REMOTE_USER") or None, env.get("REMOTE_ADDR") or None, env.get("GIT_NAMESPACE") or None,
                   protocol_version(env.get("GIT_PROTOCOL")) if protocol is None else protocol, client)


@dataclass
class ServiceContext:
    """What a service needs to run: the repository, its configuration, the
    environment its git children and hooks get (ENV: stock's run_service()
    environment, the only thing handed on to git/gitexec.py), the request's
    metadata, and the server's settings, parsed once."""
    repo: Repo
    config: RepoConfig
    env: gitexec.GitEnv
    request: RequestInfo
    log: list[str]
    settings: Settings
    trace: Trace = field(default_factory=Trace)
    # what runs after a push landed, each called as f(gitdir, env, in_process); set by http/backend.py
    after_push: tuple = ()
    service_config: object = None     # the service's configuration, parsed once (fetch/uploadconfig.py)
    pin: object = None                # a time-travel pin from the URL (model/pin.Pin), resolved by the service
    pinned: Optional[int] = None      # the version this request reads the repository at (None: the latest)
    after_answer: list = field(default_factory=list)   # run once the answer is sent (a build it must not slow)
    _store: object = field(default=None, repr=False)
    _store_opened: bool = field(default=False, repr=False)
    _repository: Optional[Repository] = field(default=None, repr=False)

    @property
    def gitdir(self) -> str:
        return self.repo.gitdir

    @property
    def repository(self) -> Repository:
        """The repository as storage and packs see it (runtime/repository.py): made once, here."""
        if self._repository is None:
            root = self.env.get("GIT_PROJECT_ROOT") or os.environ.get("GIT_PROJECT_ROOT") or None
            self._repository = Repository(self.gitdir, self.settings, self.env, root)
        return self._repository

    @property
    def protocol_version(self) -> int:
        return self.request.protocol

    @property
    def namespace(self) -> Optional[str]:
        return self.request.namespace

    def refstore(self):
        """The repository's ref store, brought up to the disk (once per request), or None."""
        if not self._store_opened:
            self._store_opened = True
            from .refstore import snapshots as refview  # startup: sqlite3 only where refs are read
            self._store = refview.open_store(self.repository, self.log)
            self.trace["version"] = self._store.version if self._store is not None else "-"
        return self._store

    def snapshot(self, namespace: Optional[str] = None) -> "RefSnapshot":
        from .refstore import snapshots as refview  # startup
        if self.pinned is not None:
            return self.refstore().snapshot_at(self.pinned, namespace)
        return refview.snapshot(self.refstore(), self.repository, namespace)

    def pin_to(self, pin) -> None:
        """Read the repository as PIN (model/pin.Pin) names it from now on;
        PinError when it names no version, or there is no ref store."""
        from .model.pin import PinError  # startup
        store = self.refstore()
        if store is None:
            raise PinError("this repository has no ref store: no earlier version can be read")
        self.pinned = store.resolve_pin(pin)
        self.pin = pin
        self.trace["pin"] = self.pinned


def protocol_version(value: Optional[str]) -> int:
    """determine_protocol_version_server(): the highest version=N among ':'-separated items."""
    best = 0
    for item in (value or "").split(":"):
        if item.startswith("version="):
            v = item[len("version="):]
            if v in ("0", "1", "2"):
                best = max(best, int(v))
    return best


_EXEC_PATH: Optional[str] = None


def _exec_path() -> str:
    global _EXEC_PATH
    if _EXEC_PATH is None:
        res = gitexec.git(["--exec-path"], cwd="/")
        _EXEC_PATH = res.stdout.decode().strip() if res.ok else ""
    return _EXEC_PATH


def child_env(env: Mapping[str, str], gitdir: str, with_exec_path: bool = True) -> gitexec.GitEnv:
    """run_service()'s environment: everything we were given, plus the
    committer identity and the protocol version stock derives."""
    out = gitexec.GitEnv(env)
    out["GIT_DIR"] = gitdir
    # stock's setup_path() exports the exec path and puts it first on PATH, so
    # children and hooks see GIT_EXEC_PATH and can run dashed helpers
    # (git-sh-setup). Only POSTs run hooks; GETs skip the extra `git --exec-path`.
    exec_path = out.get("GIT_EXEC_PATH") or (_exec_path() if with_exec_path else "")
    if exec_path:
        out["GIT_EXEC_PATH"] = exec_path
        old = out.get("PATH", "")
        if old.split(":")[0] != exec_path:
            out["PATH"] = exec_path + (":" + old if old else "")
    if "GIT_COMMITTER_NAME" not in out:
        out["GIT_COMMITTER_NAME"] = out.get("REMOTE_USER") or "anonymous"
    if "GIT_COMMITTER_EMAIL" not in out:
        user = out.get("REMOTE_USER") or "anonymous"
        out["GIT_COMMITTER_EMAIL"] = f"{user}@http.{out.get('REMOTE_ADDR') or '(none)'}"
    if "HTTP_GIT_PROTOCOL" in out and "GIT_PROTOCOL" not in out:
        out["GIT_PROTOCOL"] = out["HTTP_GIT_PROTOCOL"]
    return out


def service_enabled(name: str, config: RepoConfig, user: Optional[str]) -> bool:
    """http.uploadpack / http.receivepack as stock's backend reads them: set, the
    value (unparseable: off); unset, upload-pack on and receive-pack only for
    an authenticated USER."""
    key = "http." + name.replace("-", "")
    if config.has(key):
        try:
            return config.bool(key, False)
        except ConfigError:
            return False
    return name == "upload-pack" or bool(user)


class ServiceRefused(Exception):
    """A service ends the request before its body: an HTTP status and reason,
    the server log's message, and headers after Status (http/backend.py
    answers it as an HttpError)."""

    def __init__(self, status: int, reason: str, log: str = "", extra: Optional[list[tuple[str, str]]] = None,
                 body: bytes = b""):
        super().__init__(log or reason)
        self.status = status
        self.reason = reason
        self.log = log
        self.extra = extra or []
        self.body = body


def _file_chunks(f, size: int) -> Iterator[bytes]:
    with f:
        while size > 0:
            chunk = f.read(min(CHUNK, size))
            if not chunk:
                return
            size -= len(chunk)
            yield chunk


class FileBody:
    """A file body that WSGI servers may send with sendfile (wsgi.file_wrapper):
    SIZE bytes from the file's position (its Content-Length)."""

    def __init__(self, f, size: int):
        self.file = f
        self.size = size

    def __iter__(self) -> Iterator[bytes]:
        return _file_chunks(self.file, self.size)

    def close(self) -> None:
        self.file.close()

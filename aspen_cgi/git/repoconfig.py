"""A repository's git configuration, read once per request through git itself.

`git config -l -z` gives the whole stack (system, global, repository,
includes) exactly as git sees it; this module parses it and answers typed
questions with git's own rules for booleans and sizes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from ..model.gitvalues import ConfigError, parse_bool, parse_size
from ..model.racy import RACY_NS
from . import configfiles, gitexec

_ENV_KEYS = ("HOME", "XDG_CONFIG_HOME")
_cache: dict[tuple, tuple[tuple, "RepoConfig"]] = {}

def _stamp(files: list[str]) -> tuple:
    out: list[Optional[tuple[int, int, int, int]]] = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _key(name: str) -> str:
    """Section and variable names are case-insensitive; subsections are not."""
    first, _, rest = name.partition(".")
    if "." in rest:
        sub, _, var = rest.rpartition(".")
        return f"{first.lower()}.{sub}.{var.lower()}"
    return name.lower()


@dataclass
class RepoConfig:
    values: dict[str, list[Optional[str]]] = field(default_factory=dict)
    entries: list[tuple[str, Optional[str]]] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: bytes) -> "RepoConfig":
        values: dict[str, list[Optional[str]]] = {}
        entries: list[tuple[str, Optional[str]]] = []
        for entry in raw.split(b"\0"):
            if not entry:
                continue
            name, nl, value = entry.decode("utf-8", "surrogateescape").partition("\n")
            values.setdefault(_key(name), []).append(value if nl else None)
            entries.append((_key(name), value if nl else None))
        return cls(values, entries)

    def ordered(self, *names: str) -> list[Optional[str]]:
        """Values of several keys in the order git read them."""
        keys = {_key(n) for n in names}
        return [v for k, v in self.entries if k in keys]

    @classmethod
    def load(cls, gitdir: str, env: Optional[Mapping[str, str]] = None) -> "RepoConfig":
        """The whole configuration stack as git reads it for GITDIR; a long-lived
        process reuses the last answer while none of its files changed."""
        e = dict(os.environ if env is None else env)
        files = configfiles.sources(gitdir, e)
        key = (os.path.realpath(gitdir), tuple(sorted((k, v) for k, v in e.items()
                                                      if k.startswith("GIT_CONFIG") or k in _ENV_KEYS)))
        stamp = _stamp(files)
        hit = _cache.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        res = gitexec.git(["config", "-l", "-z"], cwd=gitdir, env=gitexec.child_env(env, GIT_DIR="."))
        config = cls.parse(res.stdout if res.ok else b"")
        racy = time.time_ns() - max((max(s[1], s[3]) for s in stamp if s), default=0) < RACY_NS
        included = config.includes
        if res.ok and not racy and not included:
            _cache[key] = (stamp, config)
        return config

    @property
    def includes(self) -> bool:
        """Whether the stack includes other files: their names and times are not among its sources."""
        return any(k.startswith(("include.", "includeif.")) for k, _ in self.entries)

    @property
    def object_format(self) -> str:
        """The repository's hash: sha1, or sha256 (`extensions.objectFormat`)."""
        return "sha256" if (self.get("extensions.objectformat") or "").lower() == "sha256" else "sha1"

    def get(self, name: str) -> Optional[str]:
        vals = self.values.get(_key(name))
        if not vals:
            return None
        return vals[-1] if vals[-1] is not None else ""

    def has(self, name: str) -> bool:
        return _key(name) in self.values

    def get_all(self, name: str) -> list[Optional[str]]:
        return list(self.values.get(_key(name), []))

    def bool(self, name: str, default: bool) -> bool:
        vals = self.values.get(_key(name))
        if not vals:
            return default
        return parse_bool(vals[-1])

    def int(self, name: str, default: int) -> int:
        v = self.get(name)
        if v is None:
            return default
        try:
            return parse_size(v)
        except ConfigError:
            return default

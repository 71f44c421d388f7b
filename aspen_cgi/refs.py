"""The repository's refs as the advertisements need them: values, peeled tags,
symbolic refs, HEAD, namespaces, and git's hideRefs rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from . import gitexec

ZERO_OID = "0" * 40


@dataclass(frozen=True)
class Ref:
    name: str                      # full name inside the namespace (namespace prefix removed)
    oid: str
    peeled: Optional[str] = None   # fully peeled object when the ref points at a tag
    symref_target: Optional[str] = None


@dataclass(frozen=True)
class RefSnapshot:
    refs: tuple[Ref, ...]
    head: Optional[Ref]            # HEAD resolved, or None if unborn/missing
    head_target: Optional[str]     # what HEAD points at when symbolic (even unborn)
    namespace_prefix: str = ""

    def by_name(self) -> dict[str, Ref]:
        return {r.name: r for r in self.refs}


def namespace_prefix(namespace: Optional[str]) -> str:
    """refs/namespaces/<a>/refs/namespaces/<b>/ for GIT_NAMESPACE=a/b."""
    if not namespace:
        return ""
    parts = [p for p in namespace.split("/") if p]
    return "".join(f"refs/namespaces/{p}/" for p in parts)


def _read_head_file(gitdir: str, prefix: str) -> tuple[Optional[str], Optional[str]]:
    """(symbolic target, direct oid) of HEAD, read as git's files backend stores it."""
    if prefix:
        return None, None  # namespaced HEAD lives under refs/ and comes from for-each-ref
    try:
        with open(os.path.join(gitdir, "HEAD"), "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape").strip()
    except OSError:
        return None, None
    if text.startswith("ref:"):
        return text[4:].strip(), None
    return None, text if len(text) == 40 else None


def read_refs(gitdir: str, env: Optional[Mapping[str, str]] = None, namespace: Optional[str] = None) -> RefSnapshot:
    prefix = namespace_prefix(namespace)
    fmt = "%(objectname) %(objecttype) %(*objectname) %(*objecttype) %(refname) %(symref)"
    res = gitexec.git(["for-each-ref", f"--format={fmt}", prefix or "refs/"], cwd=gitdir,
                      env=gitexec.child_env(env, GIT_DIR="."))
    rows = []
    deep: list[str] = []
    ns_head_target = None
    for line in res.stdout.decode("utf-8", "surrogateescape").splitlines():
        oid, otype, peeled, ptype, name, symref = (line.split(" ") + [""] * 6)[:6]
        if prefix:
            if not name.startswith(prefix):
                continue
            name = name[len(prefix):]
            if name == "HEAD":
                ns_head_target = symref[len(prefix):] if symref.startswith(prefix) else None
                continue
            if not name.startswith("refs/"):
                continue
        if ptype == "tag":
            deep.append(peeled)
        rows.append([name, oid, peeled or None, symref or None])
    if deep:
        full = _peel(gitdir, env, deep)
        for row in rows:
            if row[2] in full:
                row[2] = full[row[2]]
    refs = tuple(Ref(name, oid, peeled, (symref[len(prefix):] if prefix and symref and symref.startswith(prefix) else symref))
                 for name, oid, peeled, symref in rows)
    index = {r.name: r for r in refs}
    if prefix:
        target, direct = ns_head_target, None
    else:
        target, direct = _read_head_file(gitdir, prefix)
    head = None
    if target is not None:
        ref = index.get(target)
        if ref is not None:
            head = Ref("HEAD", ref.oid, ref.peeled, target)
    elif direct:
        head = Ref("HEAD", direct)
    return RefSnapshot(refs, head, target, prefix)


def _peel(gitdir: str, env, oids: Sequence[str]) -> dict[str, str]:
    res = gitexec.git(["cat-file", "--batch-check=%(objectname)"], cwd=gitdir,
                      env=gitexec.child_env(env, GIT_DIR="."),
                      input="".join(f"{o}^{{}}\n" for o in oids).encode())
    out = res.stdout.decode().split()
    return {o: p for o, p in zip(oids, out) if len(p) == 40}


@dataclass(frozen=True)
class HiddenRefs:
    """git's ref_is_hidden(): the last matching pattern decides; `!` negates,
    `^` matches the full name (namespace included)."""
    patterns: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config, section: str) -> "HiddenRefs":
        values = config.ordered("transfer.hiderefs", f"{section}.hiderefs")
        return cls(tuple(v.rstrip("/") for v in values if v))

    def hidden(self, name: str, full_name: Optional[str] = None) -> bool:
        full = full_name if full_name is not None else name
        for pat in reversed(self.patterns):
            neg = pat.startswith("!")
            if neg:
                pat = pat[1:]
            subject = name
            if pat.startswith("^"):
                subject, pat = full, pat[1:]
            if subject.startswith(pat) and (len(subject) == len(pat) or subject[len(pat)] == "/"):
                return not neg
        return False

    def __bool__(self) -> bool:
        return bool(self.patterns)

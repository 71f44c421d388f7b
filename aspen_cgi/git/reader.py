"""A repository's refs and objects read through git (for-each-ref, a
cat-file batch) or from its files (HEAD, shallow), as model/refs.py's
values."""

from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence

from ..model.refs import Ref, RefSnapshot, namespace_prefix
from . import gitexec


def read_head_file(gitdir: str, prefix: str) -> tuple[Optional[str], Optional[str]]:
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
    return None, text if len(text) in (40, 64) else None


def read_refs(gitdir: str, env: Optional[Mapping[str, str]] = None, namespace: Optional[str] = None) -> RefSnapshot:
    """Every ref (inside the namespace) with its peeled value and symref target.

    One `for-each-ref` gives names, values, types and the object a tag
    points to. It dies on a ref whose object is missing (which stock still
    advertises); then it is asked for names and values only, and the types
    and full peeling come from one `cat-file` batch, as they do for the
    rare tag of a tag (its full peeling)."""
    prefix = namespace_prefix(namespace)
    cenv = gitexec.child_env(env, GIT_DIR=".")
    typed = gitexec.git(["for-each-ref", f"--format={_TYPED}", prefix or "refs/"], cwd=gitdir, env=cenv)
    known: dict[str, tuple[str, Optional[str]]] = {}
    listed: list[tuple[str, ...]]
    symref: Optional[str]                   # a listed ref's (a string), then a row's
    target: Optional[str]
    if typed.returncode == 0:
        listed = []
        for line in typed.stdout.decode("utf-8", "surrogateescape").splitlines():
            oid, otype, name, symref, target, target_type = (line.split("\0") + [""] * 6)[:6]
            listed.append((oid, name, symref))
            if otype and target_type != "tag":
                known[oid] = (otype, (target or None) if otype == "tag" else None)
    else:
        res = gitexec.git(["for-each-ref", f"--format={_UNTYPED}", prefix or "refs/"], cwd=gitdir, env=cenv)
        listed = [tuple((line.split(" ", 2) + [""] * 3)[:3])
                  for line in res.stdout.decode("utf-8", "surrogateescape").splitlines()]
    rows = []
    ns_head_target = ns_head_oid = None
    for oid, name, symref in listed:
        if len(oid) not in (40, 64):
            continue
        if prefix:
            if not name.startswith(prefix):
                continue
            name = name[len(prefix):]
            if name == "HEAD":
                ns_head_target = symref[len(prefix):] if symref.startswith(prefix) else None
                ns_head_oid = oid if not symref else None
                continue
            if not name.startswith("refs/"):
                continue
            if symref:
                symref = symref[len(prefix):] if symref.startswith(prefix) else ""
        rows.append((name, oid, symref or None))
    # stock names the end of a symref chain (resolve_ref_unsafe); for-each-ref's
    # %(symref) already does, HEAD read from its file is one hop: resolve both here
    links = {name: symref for name, _, symref in rows if symref}
    rows = [(name, oid, _resolve(links, symref) if symref else None) for name, oid, symref in rows]
    info = dict(known)
    info.update(object_info(gitdir, cenv, sorted({oid for _, oid, _ in rows if oid not in known})))
    refs = []
    for name, oid, symref in rows:
        otype, peeled = info.get(oid, ("missing", None))
        refs.append(Ref(name, oid, peeled if otype == "tag" else None, symref, otype == "missing"))
    index = {r.name: r for r in refs}
    if prefix:
        target, direct = ns_head_target, ns_head_oid
    else:
        target, direct = read_head_file(gitdir, prefix)
    if target is not None:
        target = _resolve(links, target)
    head = None
    if target is not None:
        ref = index.get(target)
        if ref is not None:
            head = Ref("HEAD", ref.oid, ref.peeled, target, ref.missing)
    elif direct:
        dtype, dpeeled = info.get(direct) or object_info(gitdir, cenv, [direct]).get(direct, ("missing", None))
        head = Ref("HEAD", direct, dpeeled if dtype == "tag" else None, None, dtype == "missing")
    return RefSnapshot(tuple(refs), head, target, prefix)


_UNTYPED = "%(objectname) %(refname) %(symref)"
_TYPED = "%(objectname)%00%(objecttype)%00%(refname)%00%(symref)%00%(*objectname)%00%(*objecttype)"


def _resolve(links: Mapping[str, str], target: str) -> str:
    seen = set()
    while target in links and target not in seen:
        seen.add(target)
        target = links[target]
    return target


def object_info(gitdir: str, env, oids: Sequence[str]) -> dict[str, tuple[str, Optional[str]]]:
    """oid -> (type or "missing", fully peeled oid or None), in one cat-file run."""
    if not oids:
        return {}
    res = gitexec.git(["cat-file", "--batch-check=%(objectname) %(objecttype)"], cwd=gitdir, env=env,
                      input="".join(f"{o}\n{o}^{{}}\n" for o in oids).encode())
    lines = res.stdout.decode().splitlines()
    out: dict[str, tuple[str, Optional[str]]] = {}
    for i, oid in enumerate(oids):
        try:
            direct, peeled = lines[2 * i].split(" "), lines[2 * i + 1].split(" ")
        except IndexError:
            break
        otype = direct[1] if len(direct) == 2 and direct[1] != "missing" else "missing"
        target = peeled[0] if len(peeled) == 2 and peeled[1] != "missing" and peeled[0] != oid else None
        out[oid] = (otype, target)
    return out


def shallow_roots(gitdir: str) -> list[str]:
    """The commits listed in a shallow repository's `shallow` file."""
    try:
        with open(os.path.join(gitdir, "shallow")) as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []

"""git/reader.py: a repository's refs read through git. One typed
`for-each-ref` normally says everything; the untyped listing and a
`cat-file` batch (needed for a ref to a missing object, and for the full
peeling of a tag of a tag) must say the same."""

from __future__ import annotations

import os

from aspen_cgi.git import reader

from . import harness as h
from .test_protocol import tricky_repo


def test_the_typed_listing_says_what_the_listing_and_cat_file_say(tmp_path, monkeypatch):
    h.make_history(tmp_path / "repo.git")
    repo = tricky_repo(tmp_path)      # tags of tags, of a tree, symrefs, a namespace, a ref to a missing object
    broken = os.path.join(repo, "refs", "heads", "broken")
    with open(broken) as f:
        missing = f.read()
    os.unlink(broken)                 # first without it: the typed listing answers
    calls = []
    real = reader.gitexec.git

    def counted(args, **kw):
        calls.append(args[0])
        return real(args, **kw)
    monkeypatch.setattr(reader.gitexec, "git", counted)
    for namespace in (None, "ns"):
        calls.clear()
        typed = reader.read_refs(repo, namespace=namespace)
        # one process; cat-file only for the tags of tags (none in the namespace)
        assert calls == (["for-each-ref", "cat-file"] if namespace is None else ["for-each-ref"]), calls
        with monkeypatch.context() as m:
            m.setattr(reader, "_TYPED", "%(no-such-atom)")   # for-each-ref refuses it: the other way
            assert reader.read_refs(repo, namespace=namespace) == typed
    tags = {r.name: r for r in reader.read_refs(repo).refs}
    assert tags["refs/tags/tag3"].peeled == tags["refs/tags/v1.0"].peeled      # fully peeled through two tags
    with open(broken, "w") as f:
        f.write(missing)
    with_missing = reader.read_refs(repo)
    assert [r.name for r in with_missing.refs if r.missing] == ["refs/heads/broken"]
    assert [r for r in with_missing.refs if r.name != "refs/heads/broken"] == list(tags.values())

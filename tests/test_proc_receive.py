"""The proc-receive hook beside stock: git's own t5411 (t/t5411-proc-receive-hook.sh
and t/t5411/*.sh of git 2.39.5, which run the same cases over HTTP) ported
as differential tests. Each case runs one real `git push` over HTTP to
stock `git http-backend` (as a CGI) and to Aspen (under gunicorn), each
with its own copy of the upstream repository, and asserts that the
client printed the same thing both times, that it is what t5411 expects,
and that both upstreams end with the refs t5411 expects. The hook is
tests/proc_receive_tool.py, a Python port of t5411's `test-tool
proc-receive`. Every case also runs with `--porcelain` (t5411's *--porcelain
files), compared between stock and Aspen.

Beyond t5411: hand-made requests for what no client sends or no test-tool
hook writes (report-status v1, malformed reports, atomic pushes with `ng`),
and the ref store after hooks that really update refs."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from . import harness as h
from . import pushkit as pk
from .cgiserver import CgiServer
from .pushkit import ZERO

pytestmark = pytest.mark.timeout(120)

TOOL = Path(__file__).with_name("proc_receive_tool.py")

PRE_RECEIVE = 'exec >&2\necho "# pre-receive hook"\nwhile read old new ref\ndo\n\techo "pre-receive< $old $new $ref"\ndone\n'
POST_RECEIVE = 'exec >&2\necho "# post-receive hook"\nwhile read old new ref\ndo\n\techo "post-receive< $old $new $ref"\ndone\n'
T5411_REFS = ("refs/for", "refs/review/")     # test-0010-proc-receive-settings.sh


def hook_script(args: list[str], oids: dict[str, str]) -> str:
    """t5411's hook: a heading on stderr, then test-tool proc-receive ARGS ($A, $B, $ZERO_OID expanded)."""
    expanded = [re.sub(r"\$(ZERO_OID|[AB])", lambda m: oids[m.group(1)], a) for a in args]
    return 'printf >&2 "# proc-receive hook\\n"\nexec ' + shlex.join([sys.executable, "-S", str(TOOL), *expanded]) + "\n"


@dataclass(frozen=True)
class Bench:
    """t5411's setup_upstream_and_workbench: upstream main(A) holding B's objects too;
    workbench main(A), B, an annotated tag v123 on A, core.abbrev 7."""
    upstream: Path
    workbench: Path
    oids: dict

    def user_friendly(self, text: str, url: str) -> list[str]:
        """make_user_friendly_and_stable_output, each line's trailing blanks dropped."""
        out = []
        for line in text.replace(url, "<URL>").splitlines():
            if line.startswith("error: "):
                continue
            line = line.replace("'", '"')
            for name, key in (("COMMIT-A", "A"), ("COMMIT-B", "B"), ("TAG-v123", "TAG")):
                line = re.sub(self.oids[key][:7] + "[0-9a-f]*", f"<{name}>", line)
            line = line.replace(ZERO, "<ZERO-OID>").replace("To <URL>", "To <URL/of/upstream.git>")
            out.append(line.rstrip())
        return out

    def show_ref(self, repo: Path) -> list[str]:
        text = h.git("show-ref", cwd=str(repo), check=False).stdout.decode()
        return self.user_friendly(text, "\0")


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Bench:
    base = tmp_path_factory.mktemp("t5411")
    upstream, work = base / "upstream.git", base / "workbench"
    h.git("init", "-q", "--bare", "-b", "main", str(upstream))
    h.git("init", "-q", "-b", "main", str(work))
    oids = {}
    for name in ("A", "B"):
        (work / f"{name}.t").write_text(f"{name}\n")
        h.git("add", f"{name}.t", cwd=str(work))
        h.git("commit", "-q", "-m", name, cwd=str(work))
        oids[name] = pk.rev(work, "HEAD")
    h.git("config", "core.abbrev", "7", cwd=str(work))
    h.git("tag", "-m", "v123", "v123", oids["A"], cwd=str(work))
    h.git("remote", "add", "origin", str(upstream), cwd=str(work))
    h.git("push", "-q", "origin", "main", cwd=str(work))
    h.git("update-ref", "refs/heads/main", oids["A"], oids["B"], cwd=str(work))
    h.git("update-ref", "refs/heads/main", oids["A"], oids["B"], cwd=str(upstream))
    h.git("config", "http.receivepack", "true", cwd=str(upstream))
    pk.write_hook(upstream, "pre-receive", PRE_RECEIVE)
    pk.write_hook(upstream, "post-receive", POST_RECEIVE)
    oids["TAG"] = pk.rev(work, "v123")
    oids["ZERO_OID"] = ZERO
    return Bench(upstream, work, oids)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Stock as a CGI and Aspen under gunicorn, each over a project root of its own."""
    base = tmp_path_factory.mktemp("t5411-servers")
    roots = {side: base / side for side in ("stock", "aspen")}
    for r in roots.values():
        r.mkdir()
    stock = CgiServer(roots["stock"], {}, "stock").start()
    aspen = h.Server(roots["aspen"], {}).start()
    yield {"stock": (roots["stock"], stock.url), "aspen": (roots["aspen"], aspen.url)}
    stock.stop()
    aspen.stop()


@dataclass(frozen=True)
class Case:
    push: tuple[str, ...]                      # `git push` arguments; `origin` is the case's upstream
    hook: Optional[tuple[str, ...]] = None     # proc_receive_tool arguments; None: no proc-receive hook
    proc_refs: tuple[str, ...] = T5411_REFS    # receive.procReceiveRefs
    refs: tuple[tuple[str, str], ...] = ()     # upstream refs before the push: (ref, "A" | "B" | "TAG")
    config: tuple[tuple[str, str], ...] = ()   # more upstream configuration
    pre_receive: Optional[str] = None          # in place of t5411's pre-receive hook
    fails: bool = False
    expect: Optional[str] = None               # t5411's expected output, whole
    filtered: tuple[str, ...] = ()             # or: the lines matching these patterns, compared with EXPECT
    contains: tuple[str, ...] = ()             # lines that must be in the output
    upstream_refs: Optional[str] = None        # test_cmp_refs on the upstream
    tracking: Optional[str] = None             # the workbench's refs outside refs/{remotes,heads,tags} after
    client_config: tuple[str, ...] = ()        # `git -c` settings of the push
    # Lines left out of the stock/Aspen comparison: whether a hook that dies while
    # receive-pack writes to it is seen as a failed write or as a hook that ended is
    # timing, in stock too (t5411 does not look at them); each side's must be one of ALSO.
    unstable: Optional[str] = None
    also: tuple[str, ...] = ()


CASES: dict[str, Case] = {
    # test-0000-standard-git-push.sh
    "git-push": Case(("$B:refs/heads/main", "HEAD:refs/heads/next"), proc_refs=(), expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  <COMMIT-B> -> main
 * [new branch]      HEAD -> next""", upstream_refs="""
<COMMIT-B> refs/heads/main
<COMMIT-A> refs/heads/next"""),
    "git-push-atomic": Case(("--atomic", "main", "$B:refs/heads/next"), proc_refs=(),
                            refs=(("refs/heads/main", "B"), ("refs/heads/next", "A")), fails=True,
                            filtered=("^To ", "^ ! "), expect="""
To <URL/of/upstream.git>
 ! [rejected]        main -> main (non-fast-forward)
 ! [rejected]        <COMMIT-B> -> next (atomic push failed)""", upstream_refs="""
<COMMIT-B> refs/heads/main
<COMMIT-A> refs/heads/next"""),
    "non-fast-forward": Case(("main", "$B:refs/heads/next"), proc_refs=(), client_config=("advice.pushUpdateRejected=false",),
                             refs=(("refs/heads/main", "B"), ("refs/heads/next", "A")), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/next
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/heads/next
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  <COMMIT-B> -> next
 ! [rejected]        main -> main (non-fast-forward)""", upstream_refs="""
<COMMIT-B> refs/heads/main
<COMMIT-B> refs/heads/next"""),
    "git-push-f": Case(("-f", "refs/tags/v123", ":refs/heads/next", "main", "main:refs/review/main/topic",
                        "HEAD:refs/heads/a/b/c"), proc_refs=(),
                       refs=(("refs/heads/main", "B"), ("refs/heads/next", "B")), expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-B> <COMMIT-A> refs/heads/main
remote: pre-receive< <COMMIT-B> <ZERO-OID> refs/heads/next
remote: pre-receive< <ZERO-OID> <TAG-v123> refs/tags/v123
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/review/main/topic
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/a/b/c
remote: # post-receive hook
remote: post-receive< <COMMIT-B> <COMMIT-A> refs/heads/main
remote: post-receive< <COMMIT-B> <ZERO-OID> refs/heads/next
remote: post-receive< <ZERO-OID> <TAG-v123> refs/tags/v123
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/review/main/topic
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/a/b/c
To <URL/of/upstream.git>
 + <COMMIT-B>...<COMMIT-A> main -> main (forced update)
 - [deleted]         next
 * [new tag]         v123 -> v123
 * [new reference]   main -> refs/review/main/topic
 * [new branch]      HEAD -> a/b/c""", upstream_refs="""
<COMMIT-A> refs/heads/a/b/c
<COMMIT-A> refs/heads/main
<COMMIT-A> refs/review/main/topic
<TAG-v123> refs/tags/v123"""),
    # test-0002-pre-receive-declined.sh
    "pre-receive-declined": Case(("$B:refs/heads/main", "HEAD:refs/heads/next"), proc_refs=(), pre_receive="exit 1\n",
                                 fails=True, expect="""
To <URL/of/upstream.git>
 ! [remote rejected] <COMMIT-B> -> main (pre-receive hook declined)
 ! [remote rejected] HEAD -> next (pre-receive hook declined)""", upstream_refs="""
<COMMIT-A> refs/heads/main"""),
    # test-0011-no-hook-error.sh
    "no-hook": Case(("HEAD:next", "HEAD:refs/for/main/topic"), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: error: cannot find hook "proc-receive"
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
To <URL/of/upstream.git>
 * [new branch]      HEAD -> next
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""", upstream_refs="""
<COMMIT-A> refs/heads/main
<COMMIT-A> refs/heads/next"""),
    "no-hook-atomic": Case(("--atomic", "$B:main", "HEAD:next", "HEAD:refs/for/main/topic"), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: error: cannot find hook "proc-receive"
To <URL/of/upstream.git>
 ! [remote rejected] <COMMIT-B> -> main (fail to run proc-receive hook)
 ! [remote rejected] HEAD -> next (fail to run proc-receive hook)
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""", upstream_refs="""
<COMMIT-A> refs/heads/main"""),
    # test-0013-bad-protocol.sh
    "bad-version": Case(("HEAD:refs/for/main/topic",), ("-v", "--version", "2"), fails=True,
                        filtered=("^To ", "^ ! ", "^remote: error:"), expect="""
remote: error: proc-receive version "2" is not supported
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""", upstream_refs="""
<COMMIT-A> refs/heads/main"""),
    "die-read-version": Case(("HEAD:refs/for/main/topic",), ("-v", "--die-read-version"), fails=True,
                             filtered=("^To ", "^ ! "), expect="""
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""",
                             contains=("remote: fatal: die with the --die-read-version option",
                                       "remote: error: fail to negotiate version with proc-receive hook"),
                             upstream_refs="<COMMIT-A> refs/heads/main"),
    "die-write-version": Case(("HEAD:refs/for/main/topic",), ("-v", "--die-write-version"), fails=True,
                              filtered=("^To ", "^ ! "), expect="""
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""",
                              contains=("remote: fatal: die with the --die-write-version option",
                                        "remote: error: fail to negotiate version with proc-receive hook"),
                              upstream_refs="<COMMIT-A> refs/heads/main"),
    "die-read-commands": Case(("HEAD:refs/for/main/topic",), ("-v", "--die-read-commands"), fails=True,
                              filtered=("^To ", "^ ! "), expect="""
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""",
                              contains=("remote: fatal: die with the --die-read-commands option",),
                              unstable="^remote: error: ",
                              also=("remote: error: proc-receive exited abnormally",
                                    "remote: error: fail to write commands to proc-receive hook",
                                    "remote: error: fail to write push-options to proc-receive hook"),
                              upstream_refs="<COMMIT-A> refs/heads/main"),
    "die-read-push-options": Case(("-o", "reviewers=user1,user2", "HEAD:refs/for/main/topic"),
                                  ("-v", "--die-read-push-options"), config=(("receive.advertisePushOptions", "true"),),
                                  fails=True, filtered=("^To ", "^ ! "), expect="""
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""",
                                  contains=("remote: fatal: die with the --die-read-push-options option",),
                                  unstable="^remote: error: ",
                                  also=("remote: error: proc-receive exited abnormally",
                                        "remote: error: fail to write commands to proc-receive hook",
                                        "remote: error: fail to write push-options to proc-receive hook"),
                                  upstream_refs="<COMMIT-A> refs/heads/main"),
    "die-write-report": Case(("HEAD:refs/for/main/topic",), ("-v", "--die-write-report"), fails=True,
                             filtered=("^To ", "^ ! "), expect="""
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (fail to run proc-receive hook)""",
                             contains=("remote: fatal: die with the --die-write-report option",),
                             upstream_refs="<COMMIT-A> refs/heads/main"),
    "no-report": Case(("HEAD:refs/heads/next", "HEAD:refs/for/main/topic"), ("-v",), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
To <URL/of/upstream.git>
 * [new branch]      HEAD -> next
 ! [remote rejected] HEAD -> refs/for/main/topic (proc-receive failed to report status)""", upstream_refs="""
<COMMIT-A> refs/heads/main
<COMMIT-A> refs/heads/next"""),
    "no-ref": Case(("HEAD:refs/for/main/topic",), ("-v", "-r", "ok"), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok
remote: error: proc-receive reported incomplete status line: "ok"
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (proc-receive failed to report status)""",
                   upstream_refs="<COMMIT-A> refs/heads/main"),
    "unknown-status": Case(("HEAD:refs/for/main/topic",), ("-v", "-r", "xx refs/for/main/topic"), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> xx refs/for/main/topic
remote: error: proc-receive reported bad status "xx" on ref "refs/for/main/topic"
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (proc-receive failed to report status)""",
                           upstream_refs="<COMMIT-A> refs/heads/main"),
    # test-0020-report-ng.sh
    "ng-no-message": Case(("HEAD:refs/for/main/topic",), ("-v", "-r", "ng refs/for/main/topic"), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ng refs/for/main/topic
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (failed)""", upstream_refs="<COMMIT-A> refs/heads/main"),
    "ng-message": Case(("HEAD:refs/for/main/topic",), ("-v", "-r", "ng refs/for/main/topic error msg"), fails=True,
                       expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ng refs/for/main/topic error msg
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (error msg)""", upstream_refs="<COMMIT-A> refs/heads/main"),
    # test-0022-report-unexpect-ref.sh
    "unexpected-ref": Case(("$B:refs/heads/main", "HEAD:refs/for/main/topic"), ("-v", "-r", "ok refs/heads/main"),
                           fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/heads/main
remote: error: proc-receive reported status on unexpected ref: refs/heads/main
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  <COMMIT-B> -> main
 ! [remote rejected] HEAD -> refs/for/main/topic (proc-receive failed to report status)""",
                           upstream_refs="<COMMIT-B> refs/heads/main"),
    # test-0024-report-unknown-ref.sh
    "unknown-ref": Case(("HEAD:refs/for/a/b/c/my/topic",), ("-v", "-r", "ok refs/for/main/topic"), fails=True,
                        expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/a/b/c/my/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/a/b/c/my/topic
remote: proc-receive> ok refs/for/main/topic
remote: error: proc-receive reported status on unknown ref: refs/for/main/topic
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/a/b/c/my/topic (proc-receive failed to report status)""",
                        upstream_refs="<COMMIT-A> refs/heads/main"),
    # test-0026-push-options.sh
    "push-options-not-advertised": Case(("-o", "issue=123", "-o", "reviewer=user1", "HEAD:refs/for/main/topic"),
                                        ("-v", "-r", "ok refs/for/main/topic"),
                                        config=(("receive.advertisePushOptions", "false"),), fails=True,
                                        contains=("fatal: the receiving end does not support push options",),
                                        upstream_refs="<COMMIT-A> refs/heads/main"),
    "push-options-version-0": Case(("--atomic", "-o", "issue=123", "-o", "reviewer=user1", "HEAD:refs/heads/next",
                                    "HEAD:refs/for/main/topic"),
                                   ("-v", "--version", "0", "-r", "ok refs/for/main/topic"),
                                   config=(("receive.advertisePushOptions", "true"),), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
To <URL/of/upstream.git>
 * [new branch]      HEAD -> next
 * [new reference]   HEAD -> refs/for/main/topic""", upstream_refs="""
<COMMIT-A> refs/heads/main
<COMMIT-A> refs/heads/next"""),
    "push-options": Case(("--atomic", "-o", "issue=123", "-o", "reviewer=user1", "HEAD:refs/heads/next",
                          "HEAD:refs/for/main/topic"), ("-v", "-r", "ok refs/for/main/topic"),
                         config=(("receive.advertisePushOptions", "true"),), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive: atomic push_options
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive< issue=123
remote: proc-receive< reviewer=user1
remote: proc-receive> ok refs/for/main/topic
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
To <URL/of/upstream.git>
 * [new branch]      HEAD -> next
 * [new reference]   HEAD -> refs/for/main/topic""", upstream_refs="""
<COMMIT-A> refs/heads/main
<COMMIT-A> refs/heads/next"""),
    # test-0030-report-ok.sh
    "ok": Case(("HEAD:refs/for/main/topic",), ("-v", "-r", "ok refs/for/main/topic"), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
To <URL/of/upstream.git>
 * [new reference]   HEAD -> refs/for/main/topic""", upstream_refs="<COMMIT-A> refs/heads/main"),
    # test-0032-report-with-options.sh
    "option-without-ok": Case(("HEAD:refs/for/main/topic",),
                              ("-v", "-r", "option refname refs/pull/123/head", "-r", "option old-oid $B"),
                              fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> option refname refs/pull/123/head
remote: proc-receive> option old-oid <COMMIT-B>
remote: error: proc-receive reported "option" without a matching "ok/ng" directive
To <URL/of/upstream.git>
 ! [remote rejected] HEAD -> refs/for/main/topic (proc-receive failed to report status)"""),
    "option-refname": Case(("HEAD:refs/for/main/topic",),
                           ("-v", "-r", "ok refs/for/main/topic", "-r", "option refname refs/pull/123/head"), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/pull/123/head
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/pull/123/head
To <URL/of/upstream.git>
 * [new reference]   HEAD -> refs/pull/123/head"""),
    "option-refname-forced": Case(("HEAD:refs/for/main/topic",),
                                  ("-v", "-r", "ok refs/for/main/topic", "-r", "option refname refs/pull/123/head",
                                   "-r", "option forced-update"), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/pull/123/head
remote: proc-receive> option forced-update
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/pull/123/head
To <URL/of/upstream.git>
 * [new reference]   HEAD -> refs/pull/123/head"""),
    "option-refname-old-oid": Case(("HEAD:refs/for/main/topic",),
                                   ("-v", "-r", "ok refs/for/main/topic", "-r", "option refname refs/pull/123/head",
                                    "-r", "option old-oid $B"), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/pull/123/head
remote: proc-receive> option old-oid <COMMIT-B>
remote: # post-receive hook
remote: post-receive< <COMMIT-B> <COMMIT-A> refs/pull/123/head
To <URL/of/upstream.git>
   <COMMIT-B>..<COMMIT-A>  HEAD -> refs/pull/123/head"""),
    "option-old-oid": Case(("HEAD:refs/for/main/topic",), ("-v", "-r", "ok refs/for/main/topic", "-r", "option old-oid $B"),
                           expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option old-oid <COMMIT-B>
remote: # post-receive hook
remote: post-receive< <COMMIT-B> <COMMIT-A> refs/for/main/topic
To <URL/of/upstream.git>
   <COMMIT-B>..<COMMIT-A>  HEAD -> refs/for/main/topic"""),
    "option-old-new-oid": Case(("HEAD:refs/for/main/topic",),
                               ("-v", "-r", "ok refs/for/main/topic", "-r", "option old-oid $A", "-r", "option new-oid $B"),
                               expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/for/main/topic
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  HEAD -> refs/for/main/topic"""),
    "multiple-rewrites": Case(("HEAD:refs/for/next/topic", "HEAD:refs/for/a/b/c/topic", "HEAD:refs/for/main/topic"),
                              ("-v", "-r", "ok refs/for/a/b/c/topic", "-r", "ok refs/for/next/topic",
                               "-r", "option refname refs/pull/123/head", "-r", "ok refs/for/main/topic",
                               "-r", "option refname refs/pull/124/head", "-r", "option old-oid $B",
                               "-r", "option forced-update", "-r", "option new-oid $A"), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/a/b/c/topic
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/a/b/c/topic
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/a/b/c/topic
remote: proc-receive> ok refs/for/next/topic
remote: proc-receive> option refname refs/pull/123/head
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/pull/124/head
remote: proc-receive> option old-oid <COMMIT-B>
remote: proc-receive> option forced-update
remote: proc-receive> option new-oid <COMMIT-A>
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/pull/123/head
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/for/a/b/c/topic
remote: post-receive< <COMMIT-B> <COMMIT-A> refs/pull/124/head
To <URL/of/upstream.git>
 * [new reference]   HEAD -> refs/pull/123/head
 * [new reference]   HEAD -> refs/for/a/b/c/topic
 + <COMMIT-B>...<COMMIT-A> HEAD -> refs/pull/124/head (forced update)""", upstream_refs="<COMMIT-A> refs/heads/main"),
    # test-0034-report-ft.sh
    "fall-through": Case(("$B:refs/for/main/topic",), ("-v", "-r", "ok refs/for/main/topic", "-r", "option fall-through"),
                         expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-B> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-B> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option fall-through
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-B> refs/for/main/topic
To <URL/of/upstream.git>
 * [new reference]   <COMMIT-B> -> refs/for/main/topic""", upstream_refs="""
<COMMIT-B> refs/for/main/topic
<COMMIT-A> refs/heads/main"""),
    # test-0036-report-multi-rewrite-for-one-ref.sh
    "rewrites-one-ref-1": Case(("HEAD:refs/for/main/topic",),
                               ("-v", "-r", "ok refs/for/main/topic", "-r", "option old-oid $A", "-r", "option new-oid $B",
                                "-r", "ok refs/for/main/topic", "-r", "option refname refs/changes/24/124/1",
                                "-r", "option old-oid $ZERO_OID", "-r", "option new-oid $A",
                                "-r", "ok refs/for/main/topic", "-r", "option refname refs/changes/25/125/1",
                                "-r", "option old-oid $A", "-r", "option new-oid $B"), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/changes/24/124/1
remote: proc-receive> option old-oid <ZERO-OID>
remote: proc-receive> option new-oid <COMMIT-A>
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/changes/25/125/1
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/for/main/topic
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/changes/24/124/1
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/changes/25/125/1
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  HEAD -> refs/for/main/topic
 * [new reference]   HEAD -> refs/changes/24/124/1
   <COMMIT-A>..<COMMIT-B>  HEAD -> refs/changes/25/125/1""", upstream_refs="<COMMIT-A> refs/heads/main",
                               tracking="""
<COMMIT-A> refs/t/changes/24/124/1
<COMMIT-B> refs/t/changes/25/125/1
<COMMIT-B> refs/t/for/main/topic"""),
    "rewrites-one-ref-2": Case(("HEAD:refs/for/main/topic",),
                               ("-v", "-r", "ok refs/for/main/topic", "-r", "option refname refs/changes/24/124/1",
                                "-r", "option old-oid $ZERO_OID", "-r", "option new-oid $A",
                                "-r", "ok refs/for/main/topic", "-r", "option old-oid $A", "-r", "option new-oid $B",
                                "-r", "ok refs/for/main/topic", "-r", "option refname refs/changes/25/125/1",
                                "-r", "option old-oid $B", "-r", "option new-oid $A", "-r", "option forced-update"),
                               expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/changes/24/124/1
remote: proc-receive> option old-oid <ZERO-OID>
remote: proc-receive> option new-oid <COMMIT-A>
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/changes/25/125/1
remote: proc-receive> option old-oid <COMMIT-B>
remote: proc-receive> option new-oid <COMMIT-A>
remote: proc-receive> option forced-update
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/changes/24/124/1
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/for/main/topic
remote: post-receive< <COMMIT-B> <COMMIT-A> refs/changes/25/125/1
To <URL/of/upstream.git>
 * [new reference]   HEAD -> refs/changes/24/124/1
   <COMMIT-A>..<COMMIT-B>  HEAD -> refs/for/main/topic
 + <COMMIT-B>...<COMMIT-A> HEAD -> refs/changes/25/125/1 (forced update)""", upstream_refs="<COMMIT-A> refs/heads/main",
                               tracking="""
<COMMIT-A> refs/t/changes/24/124/1
<COMMIT-A> refs/t/changes/25/125/1
<COMMIT-B> refs/t/for/main/topic"""),
    "rewrites-one-ref-3": Case(("HEAD:refs/for/main/topic",),
                               ("-v", "-r", "ok refs/for/main/topic", "-r", "option refname refs/changes/23/123/1",
                                "-r", "ok refs/for/main/topic", "-r", "option refname refs/changes/24/124/2",
                                "-r", "option old-oid $A", "-r", "option new-oid $B"), expect="""
remote: # pre-receive hook
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/changes/23/123/1
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/changes/24/124/2
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: # post-receive hook
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/changes/23/123/1
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/changes/24/124/2
To <URL/of/upstream.git>
 * [new reference]   HEAD -> refs/changes/23/123/1
   <COMMIT-A>..<COMMIT-B>  HEAD -> refs/changes/24/124/2""", upstream_refs="<COMMIT-A> refs/heads/main",
                               tracking="""
<COMMIT-A> refs/t/changes/23/123/1
<COMMIT-B> refs/t/changes/24/124/2"""),
    # test-0038-report-mixed-refs.sh
    "mixed-refs": Case(("$B:refs/heads/main", "HEAD:refs/heads/bar", "HEAD:refs/heads/baz", "HEAD:refs/for/next/topic2",
                        "HEAD:refs/for/next/topic1", "HEAD:refs/heads/foo", "HEAD:refs/for/main/topic",
                        "HEAD:refs/for/next/topic3"),
                       ("-v", "-r", "ok refs/for/next/topic2", "-r", "ng refs/for/next/topic1 fail to call Web API",
                        "-r", "ok refs/for/main/topic", "-r", "option refname refs/for/main/topic",
                        "-r", "option old-oid $A", "-r", "option new-oid $B"), fails=True, expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/bar
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/baz
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic2
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic1
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/foo
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic3
remote: # proc-receive hook
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic2
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic1
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic3
remote: proc-receive> ok refs/for/next/topic2
remote: proc-receive> ng refs/for/next/topic1 fail to call Web API
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/for/main/topic
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/bar
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/baz
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic2
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/heads/foo
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/for/main/topic
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  <COMMIT-B> -> main
 * [new branch]      HEAD -> bar
 * [new branch]      HEAD -> baz
 * [new reference]   HEAD -> refs/for/next/topic2
 * [new branch]      HEAD -> foo
   <COMMIT-A>..<COMMIT-B>  HEAD -> refs/for/main/topic
 ! [remote rejected] HEAD -> refs/for/next/topic1 (fail to call Web API)
 ! [remote rejected] HEAD -> refs/for/next/topic3 (proc-receive failed to report status)""", upstream_refs="""
<COMMIT-A> refs/heads/bar
<COMMIT-A> refs/heads/baz
<COMMIT-A> refs/heads/foo
<COMMIT-B> refs/heads/main"""),
    # test-0040-process-all-refs.sh
    "process-all-refs": Case(("-f", "HEAD:refs/heads/main", ":refs/heads/foo", "$B:refs/heads/bar",
                              "HEAD:refs/for/main/topic", "HEAD:refs/for/next/topic"),
                             ("-v", "-r", "ok refs/heads/main", "-r", "option fall-through",
                              "-r", "ok refs/heads/foo", "-r", "option fall-through",
                              "-r", "ok refs/heads/bar", "-r", "option fall-through",
                              "-r", "ok refs/for/main/topic", "-r", "option refname refs/pull/123/head",
                              "-r", "option old-oid $A", "-r", "option new-oid $B",
                              "-r", "ok refs/for/next/topic", "-r", "option refname refs/pull/124/head",
                              "-r", "option old-oid $B", "-r", "option new-oid $A", "-r", "option forced-update"),
                             proc_refs=("refs",),
                             refs=(("refs/heads/main", "B"), ("refs/heads/foo", "A"), ("refs/heads/bar", "A"),
                                   ("refs/heads/baz", "A")), expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/bar
remote: pre-receive< <COMMIT-A> <ZERO-OID> refs/heads/foo
remote: pre-receive< <COMMIT-B> <COMMIT-A> refs/heads/main
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic
remote: # proc-receive hook
remote: proc-receive< <COMMIT-A> <COMMIT-B> refs/heads/bar
remote: proc-receive< <COMMIT-A> <ZERO-OID> refs/heads/foo
remote: proc-receive< <COMMIT-B> <COMMIT-A> refs/heads/main
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/main/topic
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/for/next/topic
remote: proc-receive> ok refs/heads/main
remote: proc-receive> option fall-through
remote: proc-receive> ok refs/heads/foo
remote: proc-receive> option fall-through
remote: proc-receive> ok refs/heads/bar
remote: proc-receive> option fall-through
remote: proc-receive> ok refs/for/main/topic
remote: proc-receive> option refname refs/pull/123/head
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: proc-receive> ok refs/for/next/topic
remote: proc-receive> option refname refs/pull/124/head
remote: proc-receive> option old-oid <COMMIT-B>
remote: proc-receive> option new-oid <COMMIT-A>
remote: proc-receive> option forced-update
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/heads/bar
remote: post-receive< <COMMIT-A> <ZERO-OID> refs/heads/foo
remote: post-receive< <COMMIT-B> <COMMIT-A> refs/heads/main
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/pull/123/head
remote: post-receive< <COMMIT-B> <COMMIT-A> refs/pull/124/head
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  <COMMIT-B> -> bar
 - [deleted]         foo
 + <COMMIT-B>...<COMMIT-A> HEAD -> main (forced update)
   <COMMIT-A>..<COMMIT-B>  HEAD -> refs/pull/123/head
 + <COMMIT-B>...<COMMIT-A> HEAD -> refs/pull/124/head (forced update)""", upstream_refs="""
<COMMIT-B> refs/heads/bar
<COMMIT-A> refs/heads/baz
<COMMIT-A> refs/heads/main"""),
    # test-0050-proc-receive-refs-with-modifiers.sh
    "modifiers-update-and-tag": Case(("$B:refs/heads/main", "v123"),
                                     ("-v", "-r", "ok refs/heads/main", "-r", "option refname refs/pull/123/head",
                                      "-r", "option old-oid $A", "-r", "option new-oid $B",
                                      "-r", "ok refs/tags/v123 ", "-r", "option refname refs/pull/124/head"),
                                     proc_refs=("m:refs/heads/main", "ad:refs/heads", "a!:refs/heads"), expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: pre-receive< <ZERO-OID> <TAG-v123> refs/tags/v123
remote: # proc-receive hook
remote: proc-receive< <COMMIT-A> <COMMIT-B> refs/heads/main
remote: proc-receive< <ZERO-OID> <TAG-v123> refs/tags/v123
remote: proc-receive> ok refs/heads/main
remote: proc-receive> option refname refs/pull/123/head
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <COMMIT-B>
remote: proc-receive> ok refs/tags/v123
remote: proc-receive> option refname refs/pull/124/head
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/pull/123/head
remote: post-receive< <ZERO-OID> <TAG-v123> refs/pull/124/head
To <URL/of/upstream.git>
   <COMMIT-A>..<COMMIT-B>  <COMMIT-B> -> refs/pull/123/head
 * [new reference]   v123 -> refs/pull/124/head""", upstream_refs="<COMMIT-A> refs/heads/main"),
    "modifiers-create-delete": Case((":refs/heads/main", "$B:refs/heads/topic", "$A:refs/heads/next", ":refs/tags/v123"),
                                    ("-v", "-r", "ok refs/heads/main", "-r", "option refname refs/pull/123/head",
                                     "-r", "option old-oid $A", "-r", "option new-oid $ZERO_OID",
                                     "-r", "ok refs/heads/next", "-r", "option refname refs/pull/124/head",
                                     "-r", "option new-oid $A"),
                                    proc_refs=("m:refs/heads/main", "ad:refs/heads", "a!:refs/heads"),
                                    refs=(("refs/heads/topic", "A"), ("refs/tags/v123", "TAG")), expect="""
remote: # pre-receive hook
remote: pre-receive< <COMMIT-A> <ZERO-OID> refs/heads/main
remote: pre-receive< <COMMIT-A> <COMMIT-B> refs/heads/topic
remote: pre-receive< <TAG-v123> <ZERO-OID> refs/tags/v123
remote: pre-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: # proc-receive hook
remote: proc-receive< <COMMIT-A> <ZERO-OID> refs/heads/main
remote: proc-receive< <ZERO-OID> <COMMIT-A> refs/heads/next
remote: proc-receive> ok refs/heads/main
remote: proc-receive> option refname refs/pull/123/head
remote: proc-receive> option old-oid <COMMIT-A>
remote: proc-receive> option new-oid <ZERO-OID>
remote: proc-receive> ok refs/heads/next
remote: proc-receive> option refname refs/pull/124/head
remote: proc-receive> option new-oid <COMMIT-A>
remote: # post-receive hook
remote: post-receive< <COMMIT-A> <ZERO-OID> refs/pull/123/head
remote: post-receive< <COMMIT-A> <COMMIT-B> refs/heads/topic
remote: post-receive< <TAG-v123> <ZERO-OID> refs/tags/v123
remote: post-receive< <ZERO-OID> <COMMIT-A> refs/pull/124/head
To <URL/of/upstream.git>
 - [deleted]         refs/pull/123/head
   <COMMIT-A>..<COMMIT-B>  <COMMIT-B> -> topic
 - [deleted]         v123
 * [new reference]   <COMMIT-A> -> refs/pull/124/head""", upstream_refs="""
<COMMIT-A> refs/heads/main
<COMMIT-B> refs/heads/topic"""),
}

TRACKING_FETCH = ("+refs/for/*:refs/t/for/*", "+refs/pull/*:refs/t/pull/*", "+refs/changes/*:refs/t/changes/*")


def _lines(text: Optional[str]) -> list[str]:
    return [line for line in (text or "").strip("\n").splitlines()]


def _filtered(lines: list[str], patterns: tuple[str, ...]) -> list[str]:
    if not patterns:
        return lines
    return [line for line in lines if any(re.search(p, line) for p in patterns)]


def _run_case(bench: Bench, servers: dict, name: str, case: Case, porcelain: bool) -> dict:
    """The case on both sides: {side: (exit status, output lines, upstream refs, workbench tracking refs)}."""
    seen = {}
    for side, (root, url) in servers.items():
        tag = f"{name}{'-p' if porcelain else ''}"
        repo = root / f"{tag}.git"
        if repo.exists():
            shutil.rmtree(repo)
        shutil.copytree(bench.upstream, repo, symlinks=True)
        for ref, what in case.refs:
            if what == "TAG":       # the upstream holds no tag object yet
                h.git("fetch", "-q", str(bench.workbench), f"refs/tags/v123:{ref}", cwd=str(repo))
            else:
                h.git("update-ref", ref, bench.oids[what], cwd=str(repo))
        for value in case.proc_refs:
            h.git("config", "--add", "receive.procReceiveRefs", value, cwd=str(repo))
        for k, v in case.config:
            h.git("config", k, v, cwd=str(repo))
        if case.pre_receive is not None:
            pk.write_hook(repo, "pre-receive", case.pre_receive)
        if case.hook is not None:
            pk.write_hook(repo, "proc-receive", hook_script(list(case.hook), bench.oids))
        work = root.parent / f"{side}-{tag}-work"
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(bench.workbench, work, symlinks=True)
        h.git("remote", "set-url", "origin", f"{url}/{tag}.git", cwd=str(work))
        if case.tracking is not None:
            for spec in TRACKING_FETCH:
                h.git("config", "--add", "remote.origin.fetch", spec, cwd=str(work))
        args = [re.sub(r"\$([AB])", lambda m: bench.oids[m.group(1)], a) for a in case.push]
        pre = [x for c in case.client_config for x in ("-c", c)]
        proc = subprocess.run(["git", *pre, "push", *(["--porcelain"] if porcelain else []), "origin", *args],
                              cwd=str(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
        out = proc.stdout.decode("utf-8", "replace")
        tracking = [line for line in bench.show_ref(work)
                    if not re.search(r" refs/(remotes|heads|tags)/", line)]
        seen[side] = (proc.returncode, bench.user_friendly(out, f"{url}/{tag}.git"), bench.show_ref(repo), tracking)
        h.fsck_strict(str(repo))
    return seen


@pytest.mark.parametrize("porcelain", [False, True], ids=["plain", "porcelain"])
@pytest.mark.parametrize("name", list(CASES))
def test_t5411_case_matches_stock(bench, servers, name, porcelain):
    case = CASES[name]
    seen = _run_case(bench, servers, name, case, porcelain)
    if case.unstable:
        for side, (st, lines, rs, tr) in list(seen.items()):
            racy = [line for line in lines if re.search(case.unstable, line)]
            assert len(racy) == 1 and racy[0] in case.also, f"{side}: {lines}"
            seen[side] = (st, [line for line in lines if line not in racy], rs, tr)
    status, out, refs, tracking = seen["aspen"]
    assert seen["aspen"] == seen["stock"], f"stock and Aspen differ:\n stock={seen['stock']}\n aspen={seen['aspen']}"
    assert (status != 0) == case.fails, out
    if case.expect is not None and not porcelain:
        assert _filtered(out, case.filtered) == _lines(case.expect), "\n".join(out)
    for line in case.contains:
        assert any(line in o for o in out), f"{line!r} not in:\n" + "\n".join(out)
    if case.upstream_refs is not None:
        assert refs == _lines(case.upstream_refs)
    if case.tracking is not None:
        assert tracking == _lines(case.tracking)


# --- once-0010-report-status-v1.sh: a hand-made request, report-status v1 -----------------------

def _empty_pack() -> bytes:
    return h.git("pack-objects", "--stdout", "-q", input=b"").stdout


def _post_both(bench: Bench, tmp_path: Path, body: bytes, hook: Optional[str], proc_refs=("refs/for",),
               config=(), hook_mode: Optional[int] = None) -> dict:
    """BODY to stock and to aspen-cgi, each over its own copy of the upstream:
    {side: (CgiResult, repo)}."""
    out = {}
    for side in ("stock", "aspen"):
        root = tmp_path / side
        root.mkdir()
        repo = root / "upstream.git"
        shutil.copytree(bench.upstream, repo, symlinks=True)
        for value in proc_refs:
            h.git("config", "--add", "receive.procReceiveRefs", value, cwd=str(repo))
        for k, v in config:
            h.git("config", k, v, cwd=str(repo))
        if hook is not None:
            path = pk.write_hook(repo, "proc-receive", hook)
            if hook_mode is not None:
                path.chmod(hook_mode)
        out[side] = (pk.post(root, "upstream.git", body, program=side), repo)
    return out


def test_report_status_v1(bench, tmp_path):
    """once-0010: report-status without v2 has no option lines; post-receive
    still sees what the hook reported."""
    A, B = bench.oids["A"], bench.oids["B"]
    hook = hook_script(["-v", "-r", "ok refs/for/main/topic1", "-r", "option fall-through",
                        "-r", "ok refs/for/main/topic2", "-r", "option refname refs/for/changes/23/123/1",
                        "-r", "option new-oid $A", "-r", "ok refs/for/main/topic2",
                        "-r", "option refname refs/for/changes/24/124/2", "-r", "option old-oid $B",
                        "-r", "option new-oid $A", "-r", "option forced-update",
                        "-r", "ng refs/for/next/topic target branch not exist"], bench.oids)
    body = pk.request([(A, B, "refs/heads/main"), (ZERO, A, "refs/for/main/topic1"), (ZERO, A, "refs/heads/foo"),
                       (ZERO, A, "refs/for/next/topic"), (ZERO, A, "refs/for/main/topic2")],
                      caps="report-status", pack=_empty_pack())
    got = _post_both(bench, tmp_path, body, hook)
    (s, srepo), (a, arepo) = got["stock"], got["aspen"]
    assert a.status == s.status == 200
    assert a.body == s.body == (b"000eunpack ok\n0017ok refs/heads/main\n001cok refs/for/main/topic1\n"
                                b"0016ok refs/heads/foo\n0033ng refs/for/next/topic target branch not exist\n"
                                b"001cok refs/for/main/topic2\n0000")
    # without side-band the hooks' output goes to the server's error log, in stock's order
    text = a.stderr.decode()
    expected = [f"post-receive< {A} {B} refs/heads/main", f"post-receive< {ZERO} {A} refs/for/main/topic1",
                f"post-receive< {ZERO} {A} refs/heads/foo", f"post-receive< {ZERO} {A} refs/for/changes/23/123/1",
                f"post-receive< {B} {A} refs/for/changes/24/124/2"]
    for t in (text, s.stderr.decode()):
        lines = [line for line in t.splitlines() if line.startswith("post-receive<")]
        assert lines == expected, t
    assert bench.show_ref(arepo) == bench.show_ref(srepo) == [
        "<COMMIT-A> refs/for/main/topic1", "<COMMIT-A> refs/heads/foo", "<COMMIT-B> refs/heads/main"]


# --- what no test-tool hook writes: byte-level cases beside stock ------------------------------

def _tool(*items: str, version=None, extra=()) -> list[str]:
    args = ["-v", *extra]
    for i in items:
        args += ["--send", i]
    for i in version or ():
        args += ["--version-send", i]
    return args


V2 = "report-status-v2 side-band-64k"
RAW = {
    # the version line is parsed as atoi() does: not a number is 0, `version=` alone is no version line
    "version-not-a-number": (_tool("ok refs/for/main/topic", "flush", version=["version=abc", "flush"]), V2),
    "version-2x": (_tool("ok refs/for/main/topic", "flush", version=["version=2x\\n", "flush"]), V2),
    "version-empty": (_tool("ok refs/for/main/topic", "flush", version=["version=", "flush"]), V2),
    # push-options claimed on a later line, unoffered, still count: a (flush-only) push-option
    # section follows the commands, which the tool reads (else it may exit mid-write: EPIPE in stock)
    "version-push-options-late": (_tool("ok refs/for/main/topic", "flush",
                                        version=["version=1\\n", "version=1\\x00push-options\\n", "flush"]), V2),
    # every kind of bad line, each reported once, all in one error
    "many-errors": (_tool("xy", "nope refs/x\\n", "option refname x", "ok refs/heads/next", "ok refs/nowhere", "flush"),
                    V2),
    "ng-empty-message": (_tool("ng refs/for/main/topic ", "flush"), V2),
    "ng-then-option": (_tool("ng refs/for/main/topic", "option refname x", "flush"), V2),
    "atomic-ng": (_tool("ng refs/for/main/topic", "flush"), "report-status side-band-64k atomic"),
    "atomic-ok": (_tool("ok refs/for/main/topic", "flush"), V2 + " atomic"),
    "fall-through-then-ok": (_tool("ok refs/for/main/topic", "option fall-through", "ok refs/for/main/topic", "flush"),
                             V2),
    "output-ends-after-a-report": (_tool("ok refs/for/main/topic"), V2),
    "delim-first": (_tool("delim", "ok refs/for/main/topic", "flush"), V2),
    "nul-in-line": (_tool("ok refs/for/main/topic\\x00junk", "flush"), V2),
    "odd-options": (_tool("ok refs/for/main/topic", "option refname", "option old-oid zz", "option NEW-OID 1",
                          "option new-oid $A", "option bogus 1", "option forced-update yes", "flush"), V2),
    "empty-refname": (_tool("ok refs/for/main/topic", "option refname ", "flush"), V2),
    "ok-without-options-then-with": (_tool("ok refs/for/main/topic", "ok refs/for/main/topic",
                                           "option refname refs/x", "option bogus", "ok refs/for/main/topic",
                                           "option bogus", "flush"), V2),
    "exits-1-after-reporting": (["-v", "-r", "ok refs/for/main/topic", "--exit", "1"], V2),
    "exits-1-after-reporting-atomic": (["-v", "-r", "ok refs/for/main/topic", "--exit", "1"], V2 + " atomic"),
    "no-side-band": (["-v", "-r", "ok refs/for/main/topic", "-r", "option refname refs/pull/1/head",
                      "-r", "option forced-update"], "report-status-v2"),
    "no-report-status": (["-v", "-r", "ok refs/for/main/topic"], "side-band-64k"),
}


@pytest.mark.parametrize("name", list(RAW))
def test_hook_reports_beside_stock(bench, tmp_path, name):
    """The same request to stock and to Aspen, the hook answering as NAME says:
    same status, report, band-2 messages and refs."""
    args, caps = RAW[name]
    A = bench.oids["A"]
    hook = hook_script(args, bench.oids)
    cmds = [(ZERO, A, "refs/for/main/topic"), (ZERO, A, "refs/heads/next")]
    if "fall-through" in name or name == "atomic-ng":
        cmds.insert(1, (ZERO, A, "refs/for/x"))
    got = _post_both(bench, tmp_path, pk.request(cmds, caps=caps, pack=_empty_pack()), hook)
    seen = {side: (r.status, pk.report_lines(r.body), pk.messages(r.body), bench.show_ref(repo),
                   r.body if "side-band" not in caps else None)
            for side, (r, repo) in got.items()}
    assert seen["aspen"] == seen["stock"]
    assert b"Traceback" not in got["aspen"][0].stderr


def _pre_receive_lines(bench: Bench, *cmds: tuple[str, str, str]) -> str:
    return "# pre-receive hook\n" + "".join(f"pre-receive< {o} {n} {r}\n" for o, n, r in cmds)


def test_hook_that_is_killed(bench, tmp_path):
    cmd = (ZERO, bench.oids["A"], "refs/for/main/topic")
    got = _post_both(bench, tmp_path, pk.request([cmd], pack=_empty_pack()), "echo dying >&2\nkill -9 $$\n")
    seen = {side: (pk.report_lines(r.body), pk.messages(r.body)) for side, (r, _) in got.items()}
    assert seen["aspen"] == seen["stock"] == (
        ["unpack ok", "ng refs/for/main/topic fail to run proc-receive hook"],
        _pre_receive_lines(bench, cmd) + "dying\nerror: fail to negotiate version with proc-receive hook\n")


def test_hook_not_executable_is_not_found(bench, tmp_path):
    cmd = (ZERO, bench.oids["A"], "refs/for/main/topic")
    got = _post_both(bench, tmp_path, pk.request([cmd], pack=_empty_pack()), "exit 0\n", hook_mode=0o644)
    seen = {side: (pk.report_lines(r.body), pk.messages(r.body)) for side, (r, _) in got.items()}
    assert seen["aspen"] == seen["stock"] == (
        ["unpack ok", "ng refs/for/main/topic fail to run proc-receive hook"],
        _pre_receive_lines(bench, cmd) + "error: cannot find hook 'proc-receive'\n")
    assert b"hook was ignored because it's not set as executable" in got["aspen"][0].stderr


@pytest.mark.parametrize("output", ["0003", "zzzz garbage", "0010ok refs/for", "ffffok"])
def test_malformed_hook_output_is_reported_not_fatal(bench, tmp_path, output):
    """Where stock dies (a pkt-line receive-pack cannot read: the client gets no
    report at all, and no ref of the push is updated), Aspen takes the hook's
    output to end there: the refs it was given fail, the others are updated,
    and the report says why (docs/differences.md)."""
    A = bench.oids["A"]
    hook = hook_script(_tool(f"raw:{output}"), bench.oids)
    body = pk.request([(ZERO, A, "refs/for/main/topic"), (ZERO, A, "refs/heads/next")], pack=_empty_pack())
    got = _post_both(bench, tmp_path, body, hook)
    (s, srepo), (a, arepo) = got["stock"], got["aspen"]
    truncated = output == "0010ok refs/for"          # a packet cut short: the end of the output, stock too
    assert a.status == s.status == 200
    if truncated:
        assert pk.report_lines(a.body) == pk.report_lines(s.body)
        assert pk.messages(a.body) == pk.messages(s.body)
    else:
        # (stock's body may even end inside a side-band packet: it died while its muxer wrote)
        assert b"unpack " not in s.body and b"fatal: protocol error: bad line length" in s.stderr
        assert "refs/heads/next" not in h.refs_of(str(srepo))
        msgs = pk.messages(a.body)
        assert "error: protocol error: bad line length" in msgs and "proc-receive exited abnormally" in msgs
    assert pk.report_lines(a.body) == ["unpack ok", "ng refs/for/main/topic fail to run proc-receive hook",
                                       "ok refs/heads/next"]
    assert h.refs_of(str(arepo))["refs/heads/next"] == A
    assert b"Traceback" not in a.stderr


def test_keepalive_while_the_hook_is_silent(bench, tmp_path):
    A = bench.oids["A"]
    hook = hook_script(["-r", "ok refs/for/main/topic", "--run", "sleep 2.5"], bench.oids)
    got = _post_both(bench, tmp_path, pk.request([(ZERO, A, "refs/for/main/topic")], pack=_empty_pack()), hook,
                     config=(("receive.keepAlive", "1"),))
    a, s = got["aspen"][0], got["stock"][0]
    assert a.body.count(b"0005\x01") >= 2 and s.body.count(b"0005\x01") >= 2
    assert pk.report_lines(a.body) == pk.report_lines(s.body) == ["unpack ok", "ok refs/for/main/topic"]


# --- the ref store: what the push really changed ------------------------------------------------

def _agit_hook(repo: Path, oids: dict, returns: list[str], run: list[str]) -> None:
    args = ["-v"]
    for r in returns:
        args += ["-r", r]
    for cmd in run:
        args += ["--run", cmd]
    pk.write_hook(repo, "proc-receive", hook_script(args, oids))


def test_store_records_what_the_hook_and_the_push_changed(root, server_factory, tmp_path):
    """An AGit-style hook turns refs/for/main into refs/pull/1/head (it writes the
    ref itself), lets refs/for/direct fall through, handles refs/for/nothing
    without writing anything; refs/heads/next is an ordinary command. The store
    holds exactly the disk's refs after, as versions of this push (never
    `external`), and no version names a ref that never changed."""
    repo = pk.enable_push(root / "repo.git")
    h.git("config", "--add", "receive.procReceiveRefs", "refs/for", cwd=str(repo))
    srv = server_factory(root)
    work = pk.clone(f"{srv.url}/repo.git", tmp_path / "work")
    tip = pk.commit(work, "change")
    _agit_hook(repo, {"A": tip, "B": tip, "ZERO_OID": ZERO},
               ["ok refs/for/main", "option refname refs/pull/1/head", "ok refs/for/direct", "option fall-through",
                "ok refs/for/nothing", "option refname refs/pull/2/head"],
               [f"git update-ref refs/pull/1/head {tip}"])
    before = [v["id"] for v in h.versions(repo)]
    p = pk.push(work, "origin", "HEAD:refs/for/main", "HEAD:refs/for/direct", "HEAD:refs/for/nothing",
                "HEAD:refs/heads/next")
    out = p.stdout.decode()
    assert "HEAD:refs/pull/1/head\t[new reference]" in out and "HEAD:refs/pull/2/head\t[new reference]" in out
    refs = h.refs_of(str(repo))
    assert refs["refs/pull/1/head"] == refs["refs/for/direct"] == refs["refs/heads/next"] == tip
    assert not any(r in refs for r in ("refs/for/main", "refs/for/nothing", "refs/pull/2/head"))
    new = [v for v in h.versions(repo) if v["id"] not in before]
    assert [v["kind"] for v in new] == ["push"] * 3, new      # the hook's, then one per ref updated (not atomic)
    assert len({v["push_id"] for v in new}) == 1 and new[0]["push_id"]
    assert [[(u["ref"], u["old"], u["new"]) for u in v["updates"]] for v in new] == [
        [("refs/pull/1/head", ZERO, tip)], [("refs/for/direct", ZERO, tip)], [("refs/heads/next", ZERO, tip)]]
    h.verify_ok(repo)
    assert "push=ok=4,ng=0 proc_receive=ok" in srv.log_text()
    # a fresh clone of everything gets what the disk holds
    again = tmp_path / "again"
    h.git("clone", "-q", "--mirror", f"{srv.url}/repo.git", str(again))
    assert h.refs_of(str(again)) == h.refs_of(str(repo))


def test_store_has_nothing_for_a_hook_that_writes_nothing(root, server_factory, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    h.git("config", "--add", "receive.procReceiveRefs", "refs/for", cwd=str(repo))
    srv = server_factory(root)
    work = pk.clone(f"{srv.url}/repo.git", tmp_path / "work")
    tip = pk.commit(work, "change")
    _agit_hook(repo, {"A": tip, "B": tip, "ZERO_OID": ZERO},
               ["ok refs/for/main", "option refname refs/pull/9/head"], [])
    before = [v["id"] for v in h.versions(repo)]
    pk.push(work, "origin", "HEAD:refs/for/main")
    assert [v for v in h.versions(repo) if v["id"] not in before] == []
    assert "refs/pull/9/head" not in h.refs_of(str(repo))
    # the objects came in all the same, as with stock: the next push of the commit sends nothing new
    assert h.git("cat-file", "-e", tip, cwd=str(repo), check=False).returncode == 0


def _topic_for_hook(root, server_factory, tmp_path):
    """A server taking refs/for/ through proc-receive, a clone with one new
    commit: (repository, server, work tree, topic's value, the new commit)."""
    repo = pk.enable_push(root / "repo.git")
    h.git("config", "--add", "receive.procReceiveRefs", "refs/for", cwd=str(repo))
    srv = server_factory(root)
    work = pk.clone(f"{srv.url}/repo.git", tmp_path / "work")
    old_topic = pk.rev(repo, "topic")
    tip = pk.commit(work, "change")
    return repo, srv, work, old_topic, tip


def test_hook_deleting_and_moving_refs(root, server_factory, tmp_path):
    """A hook may move or delete refs the push never named: the store follows the disk."""
    repo, srv, work, old_topic, tip = _topic_for_hook(root, server_factory, tmp_path)
    _agit_hook(repo, {"A": tip, "B": tip, "ZERO_OID": ZERO}, ["ok refs/for/topic", "option refname refs/heads/topic",
                                                               f"option old-oid {old_topic}", "option forced-update"],
               [f"git update-ref refs/heads/topic {tip}", "git update-ref -d refs/tags/light"])
    before = [v["id"] for v in h.versions(repo)]
    p = pk.push(work, "origin", "HEAD:refs/for/topic")
    assert "+\tHEAD:refs/heads/topic\t" in p.stdout.decode()
    new = [v for v in h.versions(repo) if v["id"] not in before]
    assert len(new) == 1 and new[0]["kind"] == "push"
    assert sorted((u["ref"], u["new"]) for u in new[0]["updates"]) == [("refs/heads/topic", tip),
                                                                       ("refs/tags/light", ZERO)]
    assert pk.rev(repo, "topic") == tip


def test_a_fetch_while_the_hook_runs_leaves_its_changes_to_its_push(root, server_factory, tmp_path):
    """A fetch (or a builder) syncing the store while the hook is still
    running sees the ref the hook moved; it records no `external` version
    of it (refstore/hookruns.py): the push's version has the change."""
    repo, srv, work, old_topic, tip = _topic_for_hook(root, server_factory, tmp_path)
    moved, go = tmp_path / "moved", tmp_path / "go"
    _agit_hook(repo, {"A": tip, "B": tip, "ZERO_OID": ZERO}, ["ok refs/for/topic", "option refname refs/heads/topic",
                                                               f"option old-oid {old_topic}", "option forced-update"],
               [f"git update-ref refs/heads/topic {tip}", f"touch {moved}",
                f"i=0; while [ ! -f {go} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"])
    before = [v["id"] for v in h.versions(repo)]
    result: list = []
    pusher = threading.Thread(target=lambda: result.append(pk.push(work, "origin", "HEAD:refs/for/topic")))
    pusher.start()
    deadline = time.monotonic() + 60
    while not moved.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert moved.exists()
    seen = subprocess.run(["git", "ls-remote", f"{srv.url}/repo.git", "refs/heads/topic"], capture_output=True,
                          text=True, timeout=60)
    assert seen.returncode == 0 and seen.stdout.split()[0] in (old_topic, tip)
    go.touch()
    pusher.join(timeout=120)
    assert "+\tHEAD:refs/heads/topic\t" in result[0].stdout.decode()
    new = [v for v in h.versions(repo) if v["id"] not in before]
    assert [v["kind"] for v in new] == ["push"]
    assert [(u["ref"], u["new"]) for u in new[0]["updates"]] == [("refs/heads/topic", tip)]


def test_value_less_proc_receive_refs_refuses_pushes(bench, tmp_path):
    """`[receive] procReceiveRefs` without a value: stock's receive-pack will not
    start (a 200 with an empty body, `bad config variable` in the log); Aspen
    answers 500 with the reason in the log. Neither takes the push."""
    A = bench.oids["A"]
    body = pk.request([(ZERO, A, "refs/for/main/topic"), (ZERO, A, "refs/heads/next")], pack=_empty_pack())
    out = {}
    for side in ("stock", "aspen"):
        root = tmp_path / side
        root.mkdir()
        repo = root / "upstream.git"
        shutil.copytree(bench.upstream, repo, symlinks=True)
        with open(repo / "config", "a") as f:
            f.write("[receive]\n\tprocReceiveRefs\n")
        out[side] = (pk.post(root, "upstream.git", body, program=side), h.refs_of(str(repo)))
    (s, srefs), (a, arefs) = out["stock"], out["aspen"]
    assert (s.status, s.body) == (200, b"") and b"bad config variable 'receive.procreceiverefs'" in s.stderr
    assert a.status == 500 and b"bad config variable 'receive.procreceiverefs'" in a.stderr
    assert srefs == arefs == h.refs_of(str(bench.upstream))

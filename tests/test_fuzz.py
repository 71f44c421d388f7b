"""The fuzz targets of `aspen-bench fuzz`, a short fixed-seed pass each
(hypothesis, seeded: the same inputs on every run), plus every crash the
fuzzer found, as a regression test with its exact input."""

from __future__ import annotations

import subprocess

import pytest

from aspen_cgi.http.body import BodyError, parse_content_length
from aspen_cgi.protocol.pktline import FLUSH, ProtocolError, encode
from aspen_cgi.protocol.requests import parse_v0, parse_v2
from bench.fuzz import all_targets, corpus, pipeline, select
from bench.fuzz.model import Session
from bench.fuzz.runner import run_target

SEED = 20261130
# inputs per target in CI: parsers are cheap; pipeline and http-wire run git and a server
EXAMPLES = {"pipeline": 300, "push": 60, "http-wire": 300, "body": 200, "cgi": 40}
DEFAULT_EXAMPLES = 600
MIN_OUTCOMES = {"pack-header": 3, "cgi-vars": 3}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    root, captured = corpus.build(work)
    s = Session(captured, root, work / "work")
    s.workdir.mkdir()
    yield s
    # pushes leave refs 1,200 directories deep, past what shutil.rmtree (pytest's clean-up) can recurse
    subprocess.run(["rm", "-rf", str(work)], check=False)   # a background pack build may still be writing


def test_corpus_is_real_client_traffic(session):
    """Every kind of request the targets start from was captured from a git client."""
    labels = {r.label for r in session.corpus.requests if r.method == "POST"}
    assert {"clone-v0", "clone-v2", "depth-v2", "filter-v2", "push-options", "push-atomic", "push-delete",
            "fetch-haves-v0"} <= labels
    assert session.corpus.posts("upload-pack", 0) and session.corpus.posts("upload-pack", 2)
    assert any(r.content_encoding == "gzip" for r in session.corpus.requests), "no gzipped request captured"
    push = [r.plain_body for r in session.corpus.posts("receive-pack") if b"push-options" in r.plain_body]
    assert push and b"ci.skip" in push[0] and b"PACK" in push[0]


@pytest.mark.parametrize("name", [t.name for t in all_targets()])
def test_fixed_seed_pass(session, name):
    target, = select(name)
    n = EXAMPLES.get(name, DEFAULT_EXAMPLES)
    result = run_target(target, session, seed=SEED, examples=n)
    assert result.error is None, result.error
    report = "\n\n".join(f"{c.signature} x{c.count}\ninput: {c.input!r}"[:3000] + "\n" + c.detail[-3000:]
                         for c in result.crashes)
    assert result.crash_count == 0, report
    assert result.tried >= n
    assert len(result.outcomes) >= MIN_OUTCOMES.get(name, 5), result.outcomes


def test_cli_lists_fuzz_targets():
    from bench.cli import build_parser
    args = build_parser().parse_args(["fuzz", "--seconds", "5", "--targets", "pktline,body", "--seed", "3"])
    assert args.seconds == 5 and args.seed == 3 and [t.name for t in select(args.targets)] == ["pktline", "body"]
    with pytest.raises(ValueError, match="unknown fuzz target"):
        select("pktline,nope")


def test_a_crash_is_recorded_and_saved(tmp_path):
    """A target that raises something undocumented: counted, grouped by where it
    raised, and saved with its input and traceback in the results folder."""
    import contextlib

    from hypothesis import strategies as st

    from bench.fuzz import report
    from bench.fuzz.model import Target

    def run(data: bytes) -> str:
        if data[:1] == b"x":
            raise KeyError(data)
        return "ok"

    target = Target("toy", "a parser with a bug", lambda s: st.binary(max_size=4) | st.just(b"xy"),
                    lambda s: contextlib.nullcontext(run))
    result = run_target(target, None, seed=1, examples=200)
    assert result.tried == 200 and result.crash_count >= 1 and len(result.crashes) == 1
    assert "raised KeyError" in result.crashes[0].signature and "CRASH KeyError" in result.outcomes
    folder = report.write(tmp_path / "r", [result], {"seed": 1})
    saved, = (folder / "crashes").iterdir()
    assert (saved / "input.bin").read_bytes()[:1] == b"x"
    assert "KeyError" in (saved / "traceback.txt").read_text()
    assert "| toy | 200 |" in (folder / "README.md").read_text()


# ---------------------------------------------------------------- crashes found, as regressions

OID = "e3147c8b66ce3527a8c0cb9bda1ad385d3fa62d8"     # fuzz.git's main (fixed dates: the same everywhere)
MANY_NINES = "9" * 5000                               # past the 4300 digits Python's int() converts


def pkt(text: str) -> bytes:
    return encode(text.encode())


def test_v0_deepen_of_5000_digits_is_an_invalid_deepen():
    # found by upload-v0: ValueError from int() escaped parse_v0 (500 with a traceback over HTTP)
    data = pkt(f"want {OID}\n") + pkt(f"deepen {MANY_NINES}\n") + FLUSH + pkt("done\n")
    with pytest.raises(ProtocolError, match="invalid deepen"):
        parse_v0(data)


def test_v2_deepen_since_of_5000_digits_is_out_of_range_for_git():
    # found by upload-v0/pipeline: the same ValueError through parse_v2's deepen-since
    data = pkt("command=fetch\n") + b"0001" + pkt(f"want {OID}\n") + pkt(f"deepen-since {MANY_NINES}\n") + \
        pkt("done\n") + FLUSH
    req = parse_v2(data)
    assert req.deepen_since == 1 << 64 and req.needs_fallback_reason == "shallow"
    negative = pkt("command=fetch\n") + b"0001" + pkt("deepen-since -" + "0" * 5000 + "12\n") + FLUSH
    assert parse_v2(negative).deepen_since == -12


def test_content_length_of_5000_digits_is_a_parse_failure():
    # found by cgi-vars and pipeline: ValueError from int() escaped parse_content_length
    with pytest.raises(BodyError) as e:
        parse_content_length(MANY_NINES)
    assert e.value.status == 400 and "failed to parse CONTENT_LENGTH" in e.value.message
    with pytest.raises(BodyError):
        parse_content_length("-" + MANY_NINES)
    assert parse_content_length("0" * 5000 + "12") == 10     # octal, as strtoimax reads a leading 0


def _answer(session: Session, inp: pipeline.HttpInput) -> pipeline.Answer:
    return pipeline.answer(inp.request(pipeline.base_env(session)))


def test_pipeline_deepen_since_of_5000_digits_is_git_s_to_answer(session):
    # before the fix: 500 "aspen: internal error" with a traceback in the log
    body = pkt("command=fetch\n") + b"0001" + pkt(f"want {OID}\n") + pkt(f"deepen-since {MANY_NINES}\n") + \
        pkt("done\n") + FLUSH
    ans = _answer(session, pipeline.HttpInput("POST", "/fuzz.git/git-upload-pack", "",
                                              "application/x-git-upload-pack-request", None, "version=2", "exact",
                                              body))
    assert ans.error is None and "Traceback" not in ans.log
    assert ans.status == 200 and b"packfile" not in ans.body    # git's upload-pack refuses it, as stock


def test_pipeline_deepen_of_5000_digits_is_400(session):
    body = pkt(f"want {OID}\n") + pkt(f"deepen {MANY_NINES}\n") + FLUSH + pkt("done\n")
    ans = _answer(session, pipeline.HttpInput("POST", "/fuzz.git/git-upload-pack", "",
                                              "application/x-git-upload-pack-request", None, None, "exact", body))
    assert ans.status == 400 and ans.log.startswith("fatal: invalid deepen")


def test_pipeline_content_length_of_5000_digits_is_400(session):
    # before the fix: 500 "aspen: internal error" with a traceback in the log
    body = pkt("command=ls-refs\n") + FLUSH
    ans = _answer(session, pipeline.HttpInput("POST", "/fuzz.git/git-upload-pack", "",
                                              "application/x-git-upload-pack-request", None, "version=2", MANY_NINES,
                                              body))
    assert ans.status == 400 and ans.log.startswith("fatal: failed to parse CONTENT_LENGTH")


def test_push_of_a_ref_name_that_is_not_utf8_is_refused_as_funny(session):
    # found by pipeline: "refs/heads/\xff\xfe" reached the ref store, whose SQLite text refused it
    # (UnicodeEncodeError): 500 with a traceback, or "fatal: internal error" on band 3 with side-band
    from bench.fuzz.strategies import EMPTY_PACK
    body = encode(f"{'0' * 40} {OID} ".encode() + b"refs/heads/\xff\xfe\0report-status side-band-64k\n") + \
        encode(f"{'0' * 40} {OID} refs/heads/caf\u00e9\n".encode()) + FLUSH + EMPTY_PACK
    ans = _answer(session, pipeline.HttpInput("POST", "/fuzz.git/git-receive-pack", "",
                                              "application/x-git-receive-pack-request", None, None, "exact", body))
    assert ans.error is None and ans.status == 200, ans.log
    assert b"Traceback" not in ans.body and b"internal error" not in ans.body and "Traceback" not in ans.log
    assert b"ng refs/heads/\xff\xfe funny refname\n" in ans.body
    assert b"ok refs/heads/caf\xc3\xa9\n" in ans.body                  # a UTF-8 name goes through
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)"], cwd=session.root / "fuzz.git",
                          capture_output=True, check=True).stdout
    assert b"refs/heads/caf\xc3\xa9\n" in refs and b"\xff\xfe" not in refs


def _push(session: Session, commands: list[tuple[str, bytes]], pack: bytes) -> pipeline.Answer:
    """A receive-pack request: (new value, ref name) creates, report-status, then PACK."""
    lines = [encode(f"{'0' * 40} {new} ".encode() + ref + (b"\0report-status\n" if i == 0 else b"\n"))
             for i, (new, ref) in enumerate(commands)]
    return _answer(session, pipeline.HttpInput("POST", "/fuzz.git/git-receive-pack", "",
                                               "application/x-git-receive-pack-request", None, None, "exact",
                                               b"".join(lines) + FLUSH + pack))


def _git_out(session: Session, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=session.root / "fuzz.git", capture_output=True)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return res.stdout.decode(errors="replace").strip()


def test_push_of_a_tree_or_a_tag_to_a_branch_is_refused_as_stock_does(session):
    # found by pipeline's end-of-run fsck: the in-process ref write set refs/heads/* to a tree or a
    # tag (fsck: "not a commit"); stock's git refuses, and now does here too
    from bench.fuzz.strategies import EMPTY_PACK
    # a tag object of its own (the module's fuzzed pushes may have deleted the repository's tags)
    tag_text = f"object {OID}\ntype commit\ntag probe\ntagger A U Thor <a@example.com> 0 +0000\n\nprobe\n"
    made = subprocess.run(["git", "mktag"], cwd=session.root / "fuzz.git", input=tag_text.encode(),
                          capture_output=True, check=True)
    tree, tag = _git_out(session, "rev-parse", f"{OID}^{{tree}}"), made.stdout.decode().strip()
    ans = _push(session, [(tree, b"refs/heads/fuzz-tree"), (tag, b"refs/heads/fuzz-tag"),
                          (tree, b"refs/tags/fuzz-tree")], EMPTY_PACK)
    assert ans.status == 200, ans.log
    assert ans.body == b"".join([pkt("unpack ok\n"), pkt("ng refs/heads/fuzz-tree failed to update ref\n"),
                                 pkt("ng refs/heads/fuzz-tag failed to update ref\n"),
                                 pkt("ok refs/tags/fuzz-tree\n"), FLUSH])
    assert f"trying to write non-commit object {tree} to branch 'refs/heads/fuzz-tree'" in ans.log
    assert "refs/heads/fuzz-t" not in _git_out(session, "for-each-ref")
    _git_out(session, "fsck", "--connectivity-only", "--no-dangling")


def test_push_of_a_ref_1200_directories_deep(session):
    # found by probing the pipeline target's deepest ref names: os.makedirs recursed once per
    # level in the in-process ref write (RecursionError, 500); such refs now go to git
    import sys

    from bench.fuzz.strategies import EMPTY_PACK
    deep = b"refs/heads/" + b"d/" * 1200 + b"x"                      # 2,412 bytes: a legal path
    too_deep = b"refs/heads/" + b"e/" * 3000 + b"x"                  # past PATH_MAX: git refuses
    ans = _push(session, [(OID, deep), (OID, too_deep)], EMPTY_PACK)
    assert ans.status == 200 and "Traceback" not in ans.log, ans.log
    assert b"ok " + deep + b"\n" in ans.body and b"ng " + too_deep + b" failed to update ref\n" in ans.body
    assert _git_out(session, "rev-parse", deep.decode()) == OID
    verify = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "verify", "-q", str(session.root / "fuzz.git")],
                            capture_output=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr

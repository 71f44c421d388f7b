"""The differential comparison itself (tests/differential.py): what the
"pack" and "sideband" modes let differ between stock and Aspen, and what
makes them fail. A comparison that cannot fail proves nothing, so each
rule is shown failing on a response that breaks it."""

from __future__ import annotations

import os

import pytest

from . import differential as d
from .harness import git

TOTAL = "Total {n} (delta 0), reused 0 (delta 0), pack-reused 0\n"
GIT_PROGRESS = ("Enumerating objects: {n}, done.\n"
                "Counting objects:  50% (1/{n})\rCounting objects: 100% ({n}/{n})\r"
                "Counting objects: 100% ({n}/{n}), done.\n")


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> tuple[bytes, int]:
    """A small real pack and its object count."""
    work = tmp_path_factory.mktemp("rules") / "r"
    git("init", "-q", "-b", "main", str(work))
    (work / "f.bin").write_bytes(os.urandom(4096))      # incompressible: the pack is over 1000 bytes
    git("add", "f.bin", cwd=str(work))
    git("commit", "-q", "-m", "one", cwd=str(work))
    data = git("pack-objects", "--stdout", "--revs", "-q", cwd=str(work), input=b"HEAD\n").stdout
    return data, d.pack_count(data)


def band(n: int, data) -> bytes:
    return d.pkt(bytes([n]) + (data.encode() if isinstance(data, str) else data))


def v0_answer(pack: bytes, progress: str = "", error: str = "", after: bytes = b"") -> bytes:
    body = d.pkt("NAK\n")
    if progress:
        body += band(2, progress)
    body += band(1, pack)
    if error:
        body += band(3, error)
    return body + d.FLUSH + after


def request(*caps: str) -> bytes:
    return d.v0_request(["1" * 40], caps=" ".join(("multi_ack_detailed", "ofs-delta") + caps))


def compare(s: bytes, a: bytes, req: bytes, mode: str = "pack") -> None:
    d._compare_bodies(mode, s, a, None, "aspen-cgi", req)


def test_the_same_answer_passes_and_progress_counts_and_timing_may_differ(pack):
    data, n = pack
    req = request("side-band-64k")
    stock = v0_answer(data, GIT_PROGRESS.format(n=n) + TOTAL.format(n=n))
    aspen = v0_answer(data, f"Enumerating objects: 1\rEnumerating objects: {n}, done.\n"
                            f"Counting objects: 100% ({n}/{n}), 1.00 KiB | 1.00 MiB/s, done.\n"
                            + TOTAL.format(n=n).replace("reused 0", "reused 1"))
    compare(stock, aspen, req)


def test_progress_missing_on_one_side_fails(pack):
    data, n = pack
    stock = v0_answer(data, GIT_PROGRESS.format(n=n) + TOTAL.format(n=n))
    with pytest.raises(AssertionError, match="progress"):
        compare(stock, v0_answer(data), request("side-band-64k"))
    with pytest.raises(AssertionError, match="progress"):
        compare(v0_answer(data), stock, request("side-band-64k"))


def test_a_different_meter_fails(pack):
    data, n = pack
    stock = v0_answer(data, GIT_PROGRESS.format(n=n) + TOTAL.format(n=n))
    aspen = v0_answer(data, GIT_PROGRESS.format(n=n) + "Compressing objects: 100% (1/1), done.\n" + TOTAL.format(n=n))
    with pytest.raises(AssertionError, match="progress"):
        compare(stock, aspen, request("side-band-64k"))


def test_aspens_stored_pack_line_stands_for_gits_meters_only_where_stock_sent_progress(pack):
    data, n = pack
    req = request("side-band-64k")
    aspen = v0_answer(data, f"Aspen: 2 stored packs, {n} objects, 0.0 MiB\n")
    compare(v0_answer(data, GIT_PROGRESS.format(n=n) + TOTAL.format(n=n)), aspen, req)
    with pytest.raises(AssertionError, match="stock sent no progress"):
        compare(v0_answer(data), aspen, req)


def test_no_progress_means_no_band_2(pack):
    data, n = pack
    req = request("side-band-64k", "no-progress")
    compare(v0_answer(data), v0_answer(data), req)
    for progress in (GIT_PROGRESS.format(n=n) + TOTAL.format(n=n), f"Aspen: 1 stored packs, {n} objects, 0.0 MiB\n"):
        with pytest.raises(AssertionError, match="no-progress"):
            compare(v0_answer(data, progress), v0_answer(data, progress), req)


def test_a_summary_that_does_not_match_the_pack_fails(pack):
    data, n = pack
    req = request("side-band-64k")
    with pytest.raises(AssertionError, match="its pack holds"):
        compare(v0_answer(data, GIT_PROGRESS.format(n=n) + TOTAL.format(n=n)),
                v0_answer(data, GIT_PROGRESS.format(n=n) + TOTAL.format(n=n + 1)), req)
    with pytest.raises(AssertionError, match="its pack holds"):
        compare(v0_answer(data, GIT_PROGRESS.format(n=n) + TOTAL.format(n=n)),
                v0_answer(data, f"Aspen: 1 stored packs, {n + 1} objects, 0.0 MiB\n"), req)


def test_band_3_text_must_be_equal(pack):
    data, _ = pack
    req = request("side-band-64k", "no-progress")
    compare(v0_answer(data, error="fatal: x\n"), v0_answer(data, error="fatal: x\n"), req)
    with pytest.raises(AssertionError, match="band 3"):
        compare(v0_answer(data, error="fatal: x\n"), v0_answer(data, error="fatal: y\n"), req)


def test_bytes_outside_the_framing_must_be_equal(pack):
    data, _ = pack
    req = request("side-band-64k", "no-progress")
    with pytest.raises(AssertionError, match="framing"):
        compare(v0_answer(data), v0_answer(data, after=b"junk"), req)
    with pytest.raises(AssertionError, match="framing"):
        compare(v0_answer(data), v0_answer(data, after=d.pkt("NAK\n")), req)
    # without side-band the pack is raw: nothing may follow it
    raw = d.pkt("NAK\n") + data
    compare(raw, raw, request("no-progress"))
    with pytest.raises(AssertionError, match="trailer"):
        compare(raw, raw + b"0000", request("no-progress"))


def test_side_band_packets_stay_within_what_was_negotiated(pack):
    data, _ = pack
    assert len(data) > 1000
    small = d.pkt("NAK\n") + b"".join(band(1, data[i:i + 995]) for i in range(0, len(data), 995)) + d.FLUSH
    large = d.pkt("NAK\n") + band(1, data) + d.FLUSH
    compare(small, small, request("side-band", "no-progress"))
    compare(small, large, request("side-band-64k", "no-progress"))
    with pytest.raises(AssertionError, match="over the 1000"):
        compare(small, large, request("side-band", "no-progress"))


def test_sideband_mode_compares_band_1_band_3_framing_and_progress():
    report = d.pkt("unpack ok\n") + d.pkt("ok refs/heads/main\n") + d.FLUSH

    def push(caps: str) -> bytes:
        return d.pkt(f"{'0' * 40} {'1' * 40} refs/heads/main\0{caps}\n") + d.FLUSH
    req = push("report-status side-band-64k")

    def answer(progress: str = "", report: bytes = report, error: str = "") -> bytes:
        return (band(2, progress) if progress else b"") + band(1, report) + (band(3, error) if error else b"") + d.FLUSH
    compare(answer("remote says hi\n"), answer("remote says hi\n"), req, "sideband")
    # the connectivity check's meter is delayed (shown after 2 s of work): it may come on one side only
    compare(answer("hook\n"), answer("Checking connectivity: 3, done.\nhook\n"), req, "sideband")
    for other, what in ((answer("remote says bye\n"), "progress"),
                        (answer("remote says hi\n", d.pkt("unpack ok\n") + d.FLUSH), "band 1"),
                        (answer("remote says hi\n", error="fatal\n"), "band 3"),
                        (answer("remote says hi\n") + b"x", "framing")):
        with pytest.raises(AssertionError, match=what):
            compare(answer("remote says hi\n"), other, req, "sideband")
    quiet = push("report-status side-band-64k quiet")
    with pytest.raises(AssertionError, match="quiet"):
        compare(answer("Resolving deltas: 100% (1/1), done.\n"), answer("Resolving deltas: 100% (1/1), done.\n"),
                quiet, "sideband")


def test_a_planned_pack_over_1_02x_stocks_bytes_fails(tmp_path):
    """A planned answer's pack has at most 1.02x the bytes of stock's (the same
    objects, deltified or compressed differently); git's answer is not bounded
    (its bytes vary run to run). Planned is what Aspen's access line says."""
    import time

    from aspen_cgi.http.accesslog import line

    from .harness import CgiResult
    work = tmp_path / "r"
    git("init", "-q", "-b", "main", str(work))
    (work / "f.txt").write_text("".join(f"line {i} of a compressible file\n" for i in range(2000)))
    git("add", "f.txt", cwd=str(work))
    git("commit", "-q", "-m", "one", cwd=str(work))
    small, large = (git("-c", f"pack.compression={level}", "pack-objects", "--stdout", "--revs", "-q", cwd=str(work),
                        input=b"HEAD\n").stdout for level in (9, 0))
    assert len(large) > 1.02 * len(small)
    req = request("side-band-64k", "no-progress")
    stock, aspen = v0_answer(small), v0_answer(large)
    compare(stock, aspen, req)
    with pytest.raises(AssertionError, match="planned pack"):
        d._compare_bodies("pack", stock, aspen, None, "aspen-cgi", req, planned_answer=True)
    d._compare_bodies("pack", aspen, stock, None, "aspen-cgi", req, planned_answer=True)

    def logged(**trace) -> CgiResult:
        return CgiResult(200, [], b"", line("POST", "/repo.git/git-upload-pack", 200, 1, time.monotonic(),
                                            trace).encode())
    assert d.planned(logged(plan="planned", why="done"))
    assert not d.planned(logged(plan="fallback", why="not-built")) and not d.planned(CgiResult(200, [], b"", b""))

"""Runs fuzz targets for a time or a number of inputs, with hypothesis
generating every input from a seed, and keeps what broke: each input's
outcome is counted, each crash recorded with its input and traceback."""

from __future__ import annotations

import re
import time
import traceback
import warnings
from typing import Any, Callable, Iterable, Optional

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

from .model import Crash, CrashRecord, Session, Target, TargetResult

MAX_OUTCOMES = 200          # distinct outcome labels kept per target; the rest count as "other"
KEEP_PER_SIGNATURE = 3      # inputs saved for each distinct crash


class _TimeUp(BaseException):
    """Ends a hypothesis run from inside (a BaseException: hypothesis does not treat it as a failure to shrink)."""


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def signature(kind: str, detail: str) -> str:
    """Two crashes are the same bug when they end in the same place the same way."""
    frames = [m for m in _FRAME.finditer(detail) if "/bench/fuzz/" not in m.group(1)]
    where = ""
    if frames:
        f = frames[-1]
        where = f" at {f.group(1).rsplit('/', 2)[-2:][-1]}:{f.group(2)} {f.group(3)}"
    last = [line for line in detail.strip().splitlines() if line and not line.startswith(" ")]
    error = last[-1].split(":")[0][:60] if last and frames else ""
    return f"{kind}{where} {error}".strip()


class _Recorder:
    def __init__(self, result: TargetResult, fn: Callable[[Any], str], deadline: Optional[float],
                 progress: Optional[Callable[[TargetResult, float], None]], started: float):
        self.result = result
        self.fn = fn
        self.deadline = deadline
        self.progress = progress
        self.started = started
        self.last_report = started

    def __call__(self, value: Any) -> None:
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise _TimeUp
        if self.progress is not None and now - self.last_report >= 2.0:
            self.last_report = now
            self.result.seconds = now - self.started
            self.progress(self.result, now - self.started)
        self.result.tried += 1
        try:
            outcome = self.fn(value)
        except Crash as c:
            self.crash(c.kind, c.detail, value)
            outcome = f"CRASH {c.kind}"
        except Exception as e:  # noqa: BLE001 - anything a target did not expect is what we are looking for
            self.crash(f"raised {type(e).__name__}", traceback.format_exc(), value)
            outcome = f"CRASH {type(e).__name__}"
        outcomes = self.result.outcomes
        if outcome not in outcomes and len(outcomes) >= MAX_OUTCOMES:
            outcome = "other"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    def crash(self, kind: str, detail: str, value: Any) -> None:
        self.result.crash_count += 1
        sig = signature(kind, detail)
        for rec in self.result.crashes:
            if rec.signature == sig:
                rec.count += 1
                if rec.count <= KEEP_PER_SIGNATURE and len(repr(value)) < len(repr(rec.input)):
                    rec.input, rec.detail = value, detail     # keep the smallest input seen
                return
        self.result.crashes.append(CrashRecord(self.result.name, sig, kind, detail, value))


def _drive(strategy, record: _Recorder, seed: int, max_examples: int) -> None:
    @hseed(seed)
    @settings(max_examples=max_examples, deadline=None, phases=[Phase.generate], database=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(strategy)
    def body(value):
        record(value)
    with warnings.catch_warnings():
        # the server under test (tempfile names, background pack builds in threads) uses `random`
        # while hypothesis draws; that is not the strategy's doing
        warnings.filterwarnings("ignore", message="Do not use the `random` module inside strategies")
        body()


def run_target(target: Target, session: Session, *, seed: int, seconds: Optional[float] = None,
               examples: Optional[int] = None,
               progress: Optional[Callable[[TargetResult, float], None]] = None) -> TargetResult:
    """Fuzz TARGET for SECONDS (wall time, from the first input) or EXAMPLES inputs, whichever ends first."""
    result = TargetResult(target.name)
    started = time.monotonic()
    try:
        strategy = target.strategy(session)
        with target.open(session) as fn:
            started = time.monotonic()
            deadline = started + seconds if seconds is not None else None
            rec = _Recorder(result, fn, deadline, progress, started)
            rounds = 0
            try:
                while True:
                    left = examples - result.tried if examples is not None else 10 ** 9
                    if left <= 0:
                        break
                    before = result.tried
                    _drive(strategy, rec, seed + rounds, left)
                    rounds += 1
                    if result.tried == before or deadline is None and examples is None:
                        break       # the strategy is exhausted
            except _TimeUp:
                pass
            result.seconds = time.monotonic() - started
    except Crash as c:      # a check the target makes when it ends (repository, server log)
        result.crash_count += 1
        result.crashes.append(CrashRecord(target.name, signature(c.kind, c.detail), c.kind, c.detail, "(end of run)"))
    except Exception as e:  # noqa: BLE001 - the target could not run; say why, go on with the others
        result.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    if not result.seconds:
        result.seconds = time.monotonic() - started
    return result


def run_all(targets: Iterable[Target], session: Session, *, seed: int, seconds: Optional[float] = None,
            examples: Optional[int] = None,
            progress: Optional[Callable[[TargetResult, float], None]] = None) -> list[TargetResult]:
    return [run_target(t, session, seed=seed, seconds=seconds, examples=examples, progress=progress)
            for t in targets]

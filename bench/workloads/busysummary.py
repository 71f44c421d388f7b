"""`busy-repo`'s figures: from the rows of its operations and pushes, one
Measurement per request shape and target (params {"shape": S}), one per
target for its pushes ({"shape": "push"}) and one summary per target
({"shape": "all"}).

Per shape and target: `ops`, `failures` (failed, or not what the server
held, or fsck unclean), `wall_p50_ms`, `wall_p99_ms`, `wall_max_ms` (of the
successful operations; the samples for the CDF), `bytes` (median received
bytes per operation, as the proxy counted them: `bytes_total` over all);
on each Aspen target, the distribution of the per-event wall ratios to
each stock target B present (the same event's wall on the Aspen target over
its wall on B): `wall_ratio_B_p50`, `wall_ratio_B_p99`, `wall_ratio_B_max`
(`results.event_ratio_metric`); on each other stock target the same ratios
to the first stock target, the run's noise floor (stock-maintained against
stock: the same binary, the same refs; for `info-refs` nothing else differs); on targets with a plan trace `plan_share`,
`planned`, `fallback`, `fallbacks` (why=count), `untraced` (no plan line:
nothing fetched, or a response cache hit), `cache_<mark>` (operations whose
last response the cache marked hit, shared, cold, ...), and, when Aspen's trace has
a build-wait key (`build_wait_ms`), `build_waited` (operations that waited
for a pack build at all), `build_wait_max_ms` and `build_wait_over_50ms`.
Pushes: the same wall figures and per-push ratios. Summary: `server_cpu_s`
(the server tree's CPU over the whole script and the packs' catching up
after it), `events`, `events_skipped`, `ops`, `failures`, `pushes`,
`push_failures`, Aspen's `packs_wait_ms`/`packs_settled`/`packs_pending`
after the script, and a target's set-up figures (stock-maintained's
`repack_s`, untimed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import stats
from ..model import Measurement
from ..results import baseline_for, event_ratio_metric, is_subject, target_order
from .base import WorkloadContext
from .common import PlanStats

if TYPE_CHECKING:
    from .busy import Busy, Event, Sizes

PLAN_KEYS = ("plan_share", "planned", "fallback", "untraced", "fallbacks")
SLOW_WAIT_MS = 50.0          # issue 40: no fetch waits more than this for a build


def bases(names: list[str]) -> list[str]:
    """The stock targets each Aspen target is compared with: every `stock*` one
    present, else the results' baseline."""
    found = [n for n in target_order(names) if n.startswith("stock") and not is_subject(n)]
    if found:
        return found
    b = baseline_for(names)
    return [b] if b else []


def walls(samples: list[float]) -> dict:
    if not samples:
        return {}
    return {"wall_p50_ms": round(stats.percentile(samples, 50), 1),
            "wall_p99_ms": round(stats.percentile(samples, 99), 1),
            "wall_max_ms": round(max(samples), 1)}


def event_ratios(mine: dict, theirs: dict, base: str) -> dict:
    """MINE and THEIRS: event key -> wall ms (successful, verified); the distribution
    of mine/theirs over the events both have."""
    ratios = [mine[k] / theirs[k] for k in mine if k in theirs and theirs[k] > 0]
    if not ratios:
        return {}
    return {event_ratio_metric(base, "p50"): round(stats.percentile(ratios, 50), 3),
            event_ratio_metric(base, "p99"): round(stats.percentile(ratios, 99), 3),
            event_ratio_metric(base, "max"): round(max(ratios), 3)}


def _compared(name: str, subjects: list[str], compare_with: list[str]) -> list[str]:
    """The targets NAME's per-event ratios are taken against: every stock one for
    an Aspen target; the first stock one for another stock target (the noise floor)."""
    if name in subjects:
        return compare_with
    return compare_with[:1] if compare_with and name in compare_with[1:] else []


def _good(row) -> bool:
    return row.ok and row.verified is True


def summarise(ctx: WorkloadContext, sizes: "Sizes", events: list["Event"], busy: "Busy", usage: dict[str, dict],
              settled: dict[str, dict]) -> list[Measurement]:
    from .busy import NAME, SHAPES
    names = [t.name for t in ctx.targets]
    subjects = [n for n in names if is_subject(n)]
    compare_with = bases(names)
    # Aspen writes build_wait_ms only on fetches that found packs unbuilt: a target
    # whose trace has it anywhere has it everywhere (absent: no wait)
    waits_traced = {n: any(r.build_wait_ms is not None for r in busy.rows if r.target == n) for n in names}
    out: list[Measurement] = []
    for shape in SHAPES:
        rows = {n: [r for r in busy.rows if r.shape == shape and r.target == n] for n in names}
        if not any(rows.values()):
            continue
        good = {n: {r.event: r.wall_ms for r in rows[n] if _good(r)} for n in names}
        for t in ctx.targets:
            mine = sorted(rows[t.name], key=lambda r: r.event)
            ok = [r for r in mine if _good(r)]
            m: dict = {"ops": len(mine), "failures": len(mine) - len(ok)}
            for b in _compared(t.name, subjects, compare_with):
                m.update(event_ratios(good[t.name], good[b], b))
            m.update(walls([r.wall_ms for r in ok]))
            got = [r.bytes for r in ok if r.bytes is not None]
            if got:
                m["bytes"] = stats.median(got)
                m["bytes_total"] = sum(got)
            if shape == "fetch-behind":
                behind = [r.behind for r in mine if r.behind is not None]
                if behind:
                    m["behind_max"] = max(behind)
            notes: list[str] = []
            plans = PlanStats(t)
            if plans.traced and shape != "info-refs":
                for r in ok:
                    plans.add(busy.plans.get((r.event, t.name), {}))
                m.update({k: v for k, v in plans.summary().items() if k in PLAN_KEYS})
                for r in ok:        # cache hits leave no plan=: they are `untraced` above
                    if r.cache:
                        m[f"cache_{r.cache}"] = m.get(f"cache_{r.cache}", 0) + 1
                if waits_traced.get(t.name):     # the key is written only by fetches that found packs unbuilt
                    waits = [r.build_wait_ms or 0.0 for r in mine]
                    m["build_waited"] = sum(1 for w in waits if w > 0)
                    m["build_wait_max_ms"] = max(waits, default=0.0)
                    m["build_wait_over_50ms"] = sum(1 for w in waits if w > SLOW_WAIT_MS)
            bad = next((r for r in mine if not _good(r)), None)
            if bad is not None:
                notes.append(f"{shape}: first failure: event {bad.event}: {bad.error.strip()[-300:] or 'failed'}")
            out.append(Measurement(NAME, t.name, {"shape": shape}, m, [r.wall_ms for r in ok], "; ".join(notes),
                                   extra={"ops": [r.as_dict() for r in mine]}))
    pushes = {n: [p for p in busy.writer.rows if p.target == n] for n in names}
    good_push = {n: {p.j: p.wall_ms for p in pushes[n] if p.ok} for n in names}
    for t in ctx.targets:
        mine = sorted(pushes[t.name], key=lambda p: p.j)
        ok = [p.wall_ms for p in mine if p.ok]
        m = {"pushes": len(mine), "failures": len(mine) - len(ok), "burst_pushes": sum(1 for p in mine if p.burst)}
        for b in _compared(t.name, subjects, compare_with):
            m.update(event_ratios(good_push[t.name], good_push[b], b))
        m.update(walls(ok))
        bad = next((p for p in mine if not p.ok), None)
        out.append(Measurement(NAME, t.name, {"shape": "push"}, m, ok,
                               f"first failed push: {bad.j}: {bad.error.strip()}" if bad else "",
                               extra={"pushes": [p.as_dict() for p in mine]}))
    run = {ev.i for ev in events} - set(busy.skipped)
    late = busy.late
    note = (sizes.describe() + f"; {len(run)} events run, {len(busy.skipped)} skipped (not started by the end)"
            + (f", started late by p50 {stats.median(late):.1f} s, max {max(late):.1f} s" if late else "")
            + ("; the writer used all its params max_pushes commits before the end" if busy.writer.exhausted else ""))
    script = [{"i": ev.i, "at": ev.at, "shape": ev.shape, "order": ev.order} for ev in events]
    for t in ctx.targets:
        mine = [r for r in busy.rows if r.target == t.name]
        m = {"events": len(run), "events_skipped": len(busy.skipped), "ops": len(mine),
             "failures": sum(1 for r in mine if not _good(r)), "pushes": len(pushes[t.name]),
             "push_failures": sum(1 for p in pushes[t.name] if not p.ok)}
        if waits_traced[t.name]:
            waits = [r.build_wait_ms or 0.0 for r in mine if r.shape != "info-refs"]
            m.update({"build_waited": sum(1 for w in waits if w > 0), "build_wait_max_ms": max(waits, default=0.0),
                      "build_wait_over_50ms": sum(1 for w in waits if w > SLOW_WAIT_MS)})
        m.update({k: v for k, v in usage.get(t.name, {}).items() if k == "server_cpu_s"})
        m.update({k: v for k, v in settled.get(t.name, {}).items()
                  if k in ("packs_wait_ms", "packs_settled", "packs_pending")})
        m.update(getattr(t, "setup", None) or {})
        mine_note = note
        if PlanStats(t).traced and not waits_traced[t.name]:
            mine_note += ("; no build_wait_ms in Aspen's trace (no fetch waited for a build, "
                          "or a server without the key)")
        out.append(Measurement(NAME, t.name, {"shape": "all"}, m, [], mine_note,
                               extra={"sizes": {k: v for k, v in vars(sizes).items()}, "script": script}))
    return out

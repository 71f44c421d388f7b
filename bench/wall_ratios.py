"""Per-fetch wall-time ratios of a random-fetch or lagging-clients run:
each fetch's Aspen wall time over stock's for the same fetch (same i), as a
distribution (p50, p90, p99, max), for all fetches, the planned ones, and
those whose plan was checked against git (check_us); and the check and
planning times. A total hides the worst single fetch; this shows it.

    python -m bench.wall_ratios results/…/raw.jsonl [more raw.jsonl …]
"""

from __future__ import annotations

import argparse
import json
import statistics


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def _fetches(path: str, target: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("target") == target:
                out.update({x["i"]: x for x in row.get("extra", {}).get("fetches", [])})
    return out


def summary(path: str, target: str = "aspen", base: str = "stock") -> list[str]:
    a, s = _fetches(path, target), _fetches(path, base)
    both = [i for i in a if i in s and s[i].get("wall_ms")]
    if not both:
        return [f"{path}: no fetch of {target} and {base} in common"]
    ratio = {i: a[i]["wall_ms"] / s[i]["wall_ms"] for i in both}

    def dist(name: str, ids: list[int]) -> str:
        xs = [ratio[i] for i in ids]
        if not xs:
            return f"  {name}: none"
        return (f"  {name} n={len(xs)}: p50 {_q(xs, .5):.2f} p90 {_q(xs, .9):.2f} p99 {_q(xs, .99):.2f} "
                f"max {max(xs):.2f} mean {statistics.mean(xs):.2f}")
    lines = [path, dist("wall ratio, all", both),
             dist("planned", [i for i in both if a[i].get("plan") == "planned"]),
             dist("checked against git", [i for i in both if a[i].get("check_us") is not None])]
    for key in ("check_us", "planning_us"):
        xs = [a[i][key] for i in a if a[i].get(key) is not None]
        if xs:
            lines.append(f"  {key} n={len(xs)}: p50 {_q(xs, .5):.0f} p90 {_q(xs, .9):.0f} "
                         f"p99 {_q(xs, .99):.0f} max {max(xs):.0f}")
    worst = max(both, key=ratio.get)
    lines.append(f"  worst: fetch i={worst} {ratio[worst]:.2f}x ({a[worst]['wall_ms']:.1f} vs "
                 f"{s[worst]['wall_ms']:.1f} ms, plan={a[worst].get('plan', '-')})")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wall_ratios", description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", nargs="+", help="raw.jsonl files of aspen-bench runs")
    ap.add_argument("--target", default="aspen")
    ap.add_argument("--base", default="stock")
    args = ap.parse_args(argv)
    for path in args.raw:
        print("\n".join(summary(path, args.target, args.base)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

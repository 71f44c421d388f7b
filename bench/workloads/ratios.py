"""Per-fetch byte ratios: each fetch of a target divided by the baseline's
(stock's) answer to the same fetch (rows matched by their index "i"), and
their distribution (p50, p99, max, how many over 1.02x), over every fetch
and over the planned ones. Shared by lagging-clients and random-fetch."""

from __future__ import annotations

from typing import Optional

from .. import stats
from ..results import baseline_for

OVER = 1.02          # a fetch "over" stock sends more than this times stock's bytes


def _ratio(a, b) -> Optional[float]:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b <= 0:
        return None
    return round(a / b, 4)


def _distribution(prefix: str, ratios: list[float]) -> dict:
    if not ratios:
        return {}
    return {f"{prefix}_p50": round(stats.percentile(ratios, 50), 4),
            f"{prefix}_p99": round(stats.percentile(ratios, 99), 4), f"{prefix}_max": round(max(ratios), 4)}


def _describe_fetch(row: dict, base: str) -> str:
    plan = row.get("plan", "untraced")
    if plan != "planned" and row.get("why"):
        plan += f" why={row['why']}"
    ext = f" extents={row['extents']}" if "extents" in row else ""
    shape = f"{row['shape']} {row['branch']}" if row.get("branch") else row["shape"]
    return (f"i={row['i']} k={row['k']} {shape} v{row['protocol']} {plan}{ext}: "
            f"{row.get('exchange_bytes', 0):,} vs {base} {row.get('base_exchange_bytes', 0):,} exchange bytes "
            f"({row.get('ratio', 0):.3f}x), pack {row.get('pack_bytes', 0):,} vs {row.get('base_pack_bytes', 0):,}")


def compare(rows: dict[str, list[dict]]) -> dict[str, dict]:
    """Per target, the per-fetch ratios against the baseline's same fetch (set
    on the rows: base_exchange_bytes, base_pack_bytes, ratio, pack_ratio) and,
    for every target but the baseline, their distribution as metrics."""
    base = baseline_for(rows)
    out: dict[str, dict] = {t: {} for t in rows}
    if base is None:
        return out
    by_i = {r["i"]: r for r in rows[base]}
    for t, mine in rows.items():
        ratios, pack_ratios, planned, over, planned_over, worst = [], [], [], 0, 0, None
        sums = [0, 0, 0, 0]
        for r in mine:
            b = by_i.get(r["i"])
            if b is None or not (r.get("ok") and b.get("ok")):
                continue
            r["base_exchange_bytes"], r["base_pack_bytes"] = b.get("exchange_bytes"), b.get("pack_bytes")
            r["ratio"] = _ratio(r.get("exchange_bytes"), b.get("exchange_bytes"))
            r["pack_ratio"] = _ratio(r.get("pack_bytes"), b.get("pack_bytes"))
            if t == base or r["ratio"] is None:
                continue
            sums[0] += r.get("exchange_bytes", 0)
            sums[1] += b.get("exchange_bytes", 0)
            sums[2] += r.get("pack_bytes", 0)
            sums[3] += b.get("pack_bytes", 0)
            ratios.append(r["ratio"])
            if r["pack_ratio"] is not None:
                pack_ratios.append(r["pack_ratio"])
            over += r["ratio"] > OVER
            if r.get("plan") == "planned":
                planned.append(r["ratio"])
                planned_over += r["ratio"] > OVER
            if worst is None or r["ratio"] > worst["ratio"]:
                worst = r
        if t == base or not ratios:
            continue
        m = {"compared": len(ratios), "over_2pct": over, "planned_compared": len(planned),
             "planned_over_2pct": planned_over}
        m.update(_distribution("ratio", ratios))
        m.update(_distribution("pack_ratio", pack_ratios))
        m.update(_distribution("planned_ratio", planned))
        m["ratio_total"] = _ratio(sums[0], sums[1])
        if sums[3]:
            m["pack_ratio_total"] = _ratio(sums[2], sums[3])
        if worst is not None:
            m["worst_fetch"] = _describe_fetch(worst, base)
        planned_rows = [r for r in mine if r.get("plan") == "planned" and r.get("ratio") is not None]
        if planned_rows:
            m["worst_planned_fetch"] = _describe_fetch(max(planned_rows, key=lambda r: r["ratio"]), base)
        out[t] = m
    return out

"""Plots drawn server-side as SVG: no chart library, nothing for a browser to fetch.

Each function returns plain data (coordinates and labels); the templates draw the SVG
elements, so every label is escaped by the template engine like any other text.
"""

from __future__ import annotations

from datetime import date, timedelta

WIDTH, HEIGHT, PAD = 560, 180, 36
PALETTE = ["#3b6ea8", "#d9822b", "#5a9e4b", "#a34d9c", "#c23b3b", "#6d6d6d"]


def burndown(days: list[dict], *, budget: int | None, since: date, today: date) -> dict:
    """Remaining budget (GPU-hours) at the end of each day this month, as a polyline."""
    per_day: dict[str, float] = {}
    for r in days:
        per_day[r["period"]] = per_day.get(r["period"], 0.0) + r["net_gpu_seconds"] / 3600
    n = (today - since).days + 1
    end_of_month = (since.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)
    span = (end_of_month - since).days + 1
    used, series = 0.0, []
    for i in range(n):
        used += per_day.get((since + timedelta(days=i)).isoformat(), 0.0)
        series.append(used)
    top = budget / 3600 if budget else max(series + [1.0])
    remaining = [(top - u) if budget else u for u in series]
    x = lambda i: PAD + (WIDTH - 2 * PAD) * i / max(span - 1, 1)  # noqa: E731
    y = lambda v: HEIGHT - PAD - (HEIGHT - 2 * PAD) * max(min(v / top, 1.0), -0.2)  # noqa: E731
    return {"width": WIDTH, "height": HEIGHT, "pad": PAD, "has_budget": budget is not None,
            "points": " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(remaining)),
            "ideal": f"{x(0):.1f},{y(top):.1f} {x(span - 1):.1f},{y(0):.1f}" if budget else "",
            "top_label": f"{top:.1f} GPU-h", "start": since.isoformat(), "end": end_of_month.isoformat(),
            "last": round(remaining[-1], 2) if remaining else 0}


def stacked_bars(accounts: list[str], pools: list[str], matrix: dict[tuple[str, str], float]) -> dict:
    """Horizontal bars, one per account, stacked by pool (GPU-hours)."""
    totals = {a: sum(matrix.get((a, p), 0.0) for p in pools) for a in accounts}
    top = max(list(totals.values()) + [1e-9])
    row_h, label_w = 26, 140
    bars = []
    for i, a in enumerate(accounts):
        x = label_w
        segs = []
        for j, p in enumerate(pools):
            v = matrix.get((a, p), 0.0)
            w = (WIDTH - label_w - 60) * max(v, 0.0) / top
            segs.append({"x": round(x, 1), "w": round(w, 1), "color": PALETTE[j % len(PALETTE)], "pool": p,
                         "value": round(v, 2)})
            x += w
        bars.append({"account": a, "y": 10 + i * row_h, "segs": segs, "total": round(totals[a], 2),
                     "end": round(x, 1)})
    return {"width": WIDTH, "height": 20 + row_h * max(len(accounts), 1), "bars": bars, "label_w": label_w,
            "legend": [{"pool": p, "color": PALETTE[j % len(PALETTE)]} for j, p in enumerate(pools)]}

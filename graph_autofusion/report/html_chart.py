"""The report's chart (F14): estimated against measured time per fusion, as inline SVG.

One row per applied fusion: the cost model's time before and after fusing (on the hardware
profile) and, when safe mode's speed check ran, the measured time of the unfused operators and
of the fused ones on the real activations. Bars share one axis in microseconds (logarithmic
when the times span more than :data:`LOG_SPAN`), and each row ends with both speed-ups; each
row carries ``data-group`` so that the page's script opens that fusion on click.
"""

from __future__ import annotations

import html
import math
from typing import Any

__all__ = ["timing_chart"]

ROW = 34
LABEL_W = 250
PLOT_W = 520
SPEEDUP_W = 190
#: Above this ratio of the longest to the shortest time the axis is logarithmic.
LOG_SPAN = 50
COLORS = {
    "estimated, unfused": "#b8c7e6",
    "estimated, fused": "#2456a6",
    "measured, unfused": "#f2c4bf",
    "measured, fused": "#b3261e",
}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) else None


def _short(s: str, width: int = 38) -> str:
    return s if len(s) <= width else s[: width - 1] + "\u2026"


def timing_chart(timing: list[dict[str, Any]]) -> str:
    """The SVG of ``report_data(...)["timing"]`` (an empty string when there is nothing)."""
    if not timing:
        return ""
    e = html.escape
    values = [
        v
        for t in timing
        for v in (*t["estimated_us"], *t["measured_us"])
        if _num(v) is not None and _num(v) > 0
    ]
    top = max(values, default=1.0) or 1.0
    scale = _Scale(min(values, default=top), top)
    height = 40 + ROW * len(timing) + 30
    width = LABEL_W + PLOT_W + 60 + SPEEDUP_W
    out = [
        f'<svg id="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="estimated and measured time '
        f'per fusion">'
    ]
    x = LABEL_W
    for k, (name, color) in enumerate(COLORS.items()):
        lx = LABEL_W + k * 150
        out.append(f'<rect x="{lx}" y="6" width="12" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + 16}" y="15">{e(name)}</text>')
    for i, t in enumerate(timing):
        y0 = 30 + i * ROW
        out.append(f'<g class="bar" data-group="{int(t["group"])}">')
        out.append(f"<title>{e(t['key'])}</title>")
        out.append(
            f'<text x="{LABEL_W - 8}" y="{y0 + 18}" text-anchor="end">{e(_short(t["key"]))}</text>'
        )
        bars = [*t["estimated_us"], *t["measured_us"]]
        for j, (v, color) in enumerate(zip(bars, COLORS.values())):
            y = y0 + 3 + j * 7
            val = _num(v)
            if val is None:
                if j == 2:
                    out.append(f'<text x="{x + 4}" y="{y + 12}" fill="#5d6675">not measured</text>')
                continue
            w = max(1.0, scale.width(val))
            out.append(
                f'<rect x="{x}" y="{y}" width="{w:.1f}" height="6" fill="{color}">'
                f"<title>{e(t['key'])}: {e(name_of(j))} {val:.2f} us</title></rect>"
            )
            if j in (1, 3):
                out.append(f'<text x="{x + w + 4:.1f}" y="{y + 5}">{val:.1f}</text>')
        out.append(f'<text x="{x + PLOT_W + 60}" y="{y0 + 18}">{e(_speedups(t))}</text></g>')
    axis_y = 30 + ROW * len(timing) + 4
    out.append(f'<line x1="{x}" y1="{axis_y}" x2="{x + PLOT_W}" y2="{axis_y}" stroke="#999"/>')
    for tick in scale.ticks():
        tx = x + scale.width(tick)
        out.append(
            f'<line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" y2="{axis_y + 4}" stroke="#999"/>'
        )
        out.append(f'<text x="{tx:.1f}" y="{axis_y + 16}" text-anchor="middle">{tick:g}</text>')
    unit = "\u00b5s, log scale" if scale.log else "\u00b5s"
    out.append(f'<text x="{x + PLOT_W + 24}" y="{axis_y + 16}">{unit}</text>')
    out.append(f'<text x="{x + PLOT_W + 60}" y="28" font-weight="600">speed-up</text>')
    out.append("</svg>")
    return "".join(out)


class _Scale:
    """Linear from 0, or logarithmic when the times span more than :data:`LOG_SPAN`."""

    def __init__(self, low: float, top: float) -> None:
        self.top = top
        self.log = top / max(low, 1e-9) > LOG_SPAN
        self.low = 10 ** math.floor(math.log10(max(low, 1e-9))) if self.log else 0.0

    def width(self, v: float) -> float:
        if not self.log:
            return PLOT_W * v / self.top
        span = math.log10(self.top / self.low) or 1.0
        return PLOT_W * max(0.0, math.log10(max(v, self.low) / self.low)) / span

    def ticks(self) -> list[float]:
        if not self.log:
            return [float(f"{self.top * k / 4:.3g}") for k in range(5)]
        out, t = [], self.low
        while t <= self.top * 1.0001:
            out.append(t)
            t *= 10
        return out


def _ratio(pair: list[Any]) -> str:
    a, b = (_num(v) for v in pair)
    return f"{a / b:.2f}x" if a is not None and b else "?"


def _speedups(t: dict[str, Any]) -> str:
    measured = _ratio(t["measured_us"]) if _num(t["measured_us"][0]) is not None else "n/a"
    return f"estimated {_ratio(t['estimated_us'])}, measured {measured}"


def name_of(j: int) -> str:
    return list(COLORS)[j]

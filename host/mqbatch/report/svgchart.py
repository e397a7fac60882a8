"""Dependency-free inline SVG charts for the HTML report (no external assets).

Every chart is one <svg class="chart"> with a title (<text class="title">), axis
labels (<text class="xlabel">, <text class="ylabel">) and a viewBox, so it
scales to the page width. Time charts share one axis: seconds since the run
started, `span` = (0, T), with fault windows shaded and labelled.

    time_panels(title, panels, span, faults, ylabel)   # small multiples, one panel per series
    log_histogram(title, values, xlabel, marks)        # log x axis, p50/p95/p99 markers
    hbars(title, bars, xlabel)                         # horizontal bars, labels on the left
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
W = 760  # viewBox width; the SVG is scaled to the column width
LEFT, RIGHT = 92, 16  # plot area margins (room for tick labels and the y label)
FAULT_FILL = "#f4c7c3"

Fault = tuple[float, float, str]  # (start s, end s, label)


def esc(text) -> str:
    return html.escape(str(text))


def nice_step(span: float, target: int = 5) -> float:
    """A 1/2/2.5/5 x 10^k step giving about `target` intervals over span."""
    if span <= 0:
        return 1.0
    raw = span / target
    exp = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * exp:
            return m * exp
    return 10 * exp


def _ticks(lo: float, hi: float, target: int) -> list[float]:
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step - 1e-9) * step
    n = int(math.floor((hi - first) / step + 1e-9)) + 1
    return [round(first + i * step, 10) for i in range(max(n, 0))]


def ticks(lo: float, hi: float, target: int = 5, at_least: int = 3) -> list[float]:
    """Round values in [lo, hi], about `target` intervals apart, and never fewer than
    `at_least` (a panel whose axis shows one number cannot be read: 3.3 alone said
    nothing about a supply voltage moving between 3.28 and 3.31 V)."""
    vs = _ticks(lo, hi, target)
    t = target
    while len(vs) < at_least and hi > lo and t < 4 * target + 8:
        t += 1
        vs = _ticks(lo, hi, t)
    return vs


def fmt(v: float, step: float | None = None) -> str:
    """Short tick label: 12, 2.5, 0.25, 12k, 1.5M; with `step`, just enough decimals
    that neighbouring ticks differ (3.295, 3.3, 3.305)."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if step:
        e = math.floor(math.log10(step) + 1e-9)
        decimals = max(0, -e + (0 if round(step / 10**e, 6) in (1, 2, 5) else 1))  # 2.5 needs one more
        return f"{v:.{decimals}f}"
    return f"{v:.4g}"


def y_range(values: Sequence[float], zero: bool = True, target: int = 4) -> tuple[float, float]:
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if zero:
        lo = min(lo, 0.0)
    if hi - lo < 1e-9:
        pad = abs(hi) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, target)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def _open(title: str, height: float) -> list[str]:
    return [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height:.0f}" '
        f'role="img" aria-label="{esc(title)}" preserveAspectRatio="xMinYMin meet">',
        f'<text class="title" x="{W / 2}" y="18" text-anchor="middle" font-size="15" '
        f'font-weight="bold">{esc(title)}</text>',
    ]


def _xlabel(text: str, height: float) -> str:
    return (
        f'<text class="xlabel" x="{LEFT + (W - LEFT - RIGHT) / 2:.0f}" y="{height - 6:.0f}" '
        f'text-anchor="middle" font-size="12">{esc(text)}</text>'
    )


def _ylabel(text: str, top: float, bottom: float) -> str:
    mid = (top + bottom) / 2
    return (
        f'<text class="ylabel" x="14" y="{mid:.0f}" transform="rotate(-90 14 {mid:.0f})" '
        f'text-anchor="middle" font-size="12">{esc(text)}</text>'
    )


class _TimeAxis:
    def __init__(self, span: tuple[float, float]):
        self.lo, self.hi = span[0], max(span[1], span[0] + 1)

    def x(self, t: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * (t - self.lo) / (self.hi - self.lo)

    def faults(self, faults: list[Fault], top: float, bottom: float, labels: bool) -> list[str]:
        out = []
        for start, end, label in faults:
            x0, x1 = self.x(max(start, self.lo)), self.x(min(end, self.hi))
            out.append(
                f'<rect class="fault" x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 1):.1f}" '
                f'height="{bottom - top:.1f}" fill="{FAULT_FILL}" opacity="0.7"><title>{esc(label)}: '
                f'{start:.1f}-{end:.1f} s</title></rect>'
            )
            if labels:
                out.append(
                    f'<text x="{x0 + 3:.1f}" y="{top + 11:.1f}" font-size="10" fill="#8a1c12">{esc(label)}</text>'
                )
        return out

    def ticks(self, y: float) -> list[str]:
        return [
            f'<text x="{self.x(t):.1f}" y="{y:.1f}" font-size="11" text-anchor="middle">{fmt(t)}</text>'
            for t in ticks(self.lo, self.hi, 8)
        ]

    def grid(self, top: float, bottom: float) -> list[str]:
        return [
            f'<line x1="{self.x(t):.1f}" y1="{top:.1f}" x2="{self.x(t):.1f}" y2="{bottom:.1f}" stroke="#eee"/>'
            for t in ticks(self.lo, self.hi, 8)
        ]


def _y_axis(lo: float, hi: float, top: float, bottom: float, n: int = 4) -> tuple[list[str], Callable[[float], float]]:
    sy = lambda v: bottom - (bottom - top) * (v - lo) / (hi - lo)
    out = []
    vs = ticks(lo, hi, n)
    step = vs[1] - vs[0] if len(vs) > 1 else None
    for v in vs:
        y = sy(v)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{LEFT - 5}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{fmt(v, step)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{top:.1f}" x2="{LEFT}" y2="{bottom:.1f}" stroke="#555"/>')
    out.append(f'<line x1="{LEFT}" y1="{bottom:.1f}" x2="{W - RIGHT}" y2="{bottom:.1f}" stroke="#555"/>')
    return out, sy


def _polyline(pts: list[tuple[float, float]], sx, sy, color: str) -> str:
    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>'


def time_panels(
    title: str,
    panels: dict[str, list[tuple[float, float]]],
    span: tuple[float, float],
    faults: list[Fault],
    ylabel: str,
    xlabel: str = "seconds since the run started",
    panel_h: int = 60,
    zero: bool = True,
) -> str:
    """Small multiples: one panel per series, same x and y scales, so no series hides
    another (`zero`: the y axis starts at 0)."""
    names = sorted(panels)
    top0, head, gap = 30, 15, 6  # each panel: its name on a line above the plot
    slot = head + panel_h + gap
    height = top0 + len(names) * slot + 40
    ax = _TimeAxis(span)
    # a low panel: a range of about 2 round steps, so that 3 or 4 ticks (never 1) fit in it
    lo, hi = y_range([y for pts in panels.values() for _, y in pts], zero, target=2)
    out = _open(title, height)
    for i, name in enumerate(names):
        top = top0 + i * slot + head
        bottom = top + panel_h
        color = PALETTE[i % len(PALETTE)]
        out.append(
            f'<text x="{LEFT + 2}" y="{top - 4:.0f}" font-size="12" font-weight="bold" '
            f'fill="{color}">{esc(name)}</text>'
        )
        out += ax.grid(top, bottom)
        out += ax.faults(faults, top, bottom, labels=(i == 0))
        axis, sy = _y_axis(lo, hi, top, bottom, 2)
        out += axis
        out.append(_polyline(panels[name], ax.x, sy, color))
    bottom = top0 + len(names) * slot - gap
    out += ax.ticks(bottom + 15)
    out.append(_ylabel(ylabel, top0, bottom))
    out.append(_xlabel(xlabel, height))
    out.append("</svg>")
    return "\n".join(out)


def _log_label(v: float) -> str:
    """Tick label of a millisecond value: 1 ms, 100 ms, 1 s, 10 s."""
    return f"{v / 1000:g} s" if v >= 1000 else f"{v:g} ms"


def _ms_label(v: float) -> str:
    """A measured millisecond value, 3 significant digits: 912 ms, 6.74 s."""
    return f"{v / 1000:.3g} s" if v >= 1000 else f"{v:.3g} ms"


def log_histogram(
    title: str,
    values: list[float],
    xlabel: str,
    marks: Sequence[tuple[str, float | None]],
    height: int = 290,
    bins_per_decade: int = 8,
) -> str:
    """Histogram on a log x axis (values > 0; smaller ones count in the first bin), with
    vertical markers (e.g. p50/p95/p99), each labelled on its own row above the plot."""
    top, bottom = 34 + 13 * len(marks), height - 44
    out = _open(title, height)
    pos = [max(v, 1e-3) for v in values]
    if not pos:
        out += [
            _ylabel("records", top, bottom),
            _xlabel(xlabel, height),
            f'<text x="{W / 2}" y="{(top + bottom) / 2:.0f}" text-anchor="middle" font-size="12">no data</text>',
            "</svg>",
        ]
        return "\n".join(out)
    d0 = math.floor(math.log10(min(pos)))
    d1 = max(math.ceil(math.log10(max(pos)) + 1e-9), d0 + 1)
    sx = lambda v: LEFT + (W - LEFT - RIGHT) * (math.log10(v) - d0) / (d1 - d0)
    nb = (d1 - d0) * bins_per_decade
    counts = [0] * nb
    for v in pos:
        counts[min(int((math.log10(v) - d0) * bins_per_decade), nb - 1)] += 1
    lo, hi = y_range(counts)
    axis, sy = _y_axis(lo, hi, top, bottom)
    out += axis
    for i, c in enumerate(counts):
        if not c:
            continue
        a, b = 10 ** (d0 + i / bins_per_decade), 10 ** (d0 + (i + 1) / bins_per_decade)
        out.append(
            f'<rect x="{sx(a):.1f}" y="{sy(c):.1f}" width="{max(sx(b) - sx(a) - 1, 1):.1f}" '
            f'height="{bottom - sy(c):.1f}" fill="{PALETTE[0]}"><title>{_log_label(a)} to '
            f'{_log_label(b)}: {c}</title></rect>'
        )
    for d in range(d0, d1 + 1):
        for m in (1, 2, 5):
            v = m * 10**d
            if v > 10**d1:
                break
            x = sx(v)
            out.append(
                f'<line x1="{x:.1f}" y1="{bottom:.1f}" x2="{x:.1f}" y2="{bottom + (5 if m == 1 else 3):.1f}" '
                f'stroke="#555"/>'
            )
            if m == 1 or d1 - d0 <= 3:
                out.append(
                    f'<text x="{x:.1f}" y="{bottom + 17:.1f}" font-size="11" text-anchor="middle">'
                    f'{_log_label(v)}</text>'
                )
    for i, (name, mark) in enumerate(marks):
        if mark is None or mark <= 0:
            continue
        x = sx(min(max(mark, 10**d0), 10**d1))
        color = ("#2ca02c", "#ff7f0e", "#d62728")[i % 3]
        out.append(
            f'<line x1="{x:.1f}" y1="{26 + 13 * i}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="{color}" '
            f'stroke-width="2" stroke-dasharray="4 3"/>'
        )
        anchor = "end" if x > W - 120 else "start"
        dx = -3 if anchor == "end" else 3
        out.append(
            f'<text x="{x + dx:.1f}" y="{36 + 13 * i}" font-size="11" text-anchor="{anchor}" '
            f'fill="{color}" font-weight="bold">{esc(name)} {_ms_label(mark)}</text>'
        )
    out.append(_ylabel("records", top, bottom))
    out.append(_xlabel(xlabel, height))
    out.append("</svg>")
    return "\n".join(out)


def hbars(title: str, bars: list[tuple[str, float]], xlabel: str, value_fmt: str = "{:g}") -> str:
    """Horizontal bars: long labels stay readable on the left."""
    row = 28
    top = 34
    height = top + max(len(bars), 1) * row + 44
    label_w = min(max([len(name) for name, _ in bars] or [4]) * 7 + 12, W // 2)  # ~7 px per character at 12 px
    plot_l, plot_r = label_w + 10, W - RIGHT - 60
    vmax = max([v for _, v in bars] or [1.0]) or 1.0
    hi = ticks(0, vmax, 4)[-1]
    hi = hi if hi >= vmax else hi + nice_step(vmax, 4)
    sx = lambda v: plot_l + (plot_r - plot_l) * v / hi
    out = _open(title, height)
    bottom = top + len(bars) * row
    for t in ticks(0, hi, 4):
        out.append(
            f'<line x1="{sx(t):.1f}" y1="{top}" x2="{sx(t):.1f}" y2="{bottom}" stroke="#e3e3e3"/>'
            f'<text x="{sx(t):.1f}" y="{bottom + 15}" font-size="11" text-anchor="middle">{fmt(t)}</text>'
        )
    for i, (name, v) in enumerate(bars):
        y = top + i * row
        out.append(
            f'<text class="ylabel" x="{label_w}" y="{y + row / 2 + 4:.0f}" font-size="12" '
            f'text-anchor="end">{esc(name)}</text>'
        )
        out.append(
            f'<rect x="{plot_l}" y="{y + 5}" width="{max(sx(v) - plot_l, 1):.1f}" height="{row - 10}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
        )
        out.append(
            f'<text x="{sx(v) + 4:.1f}" y="{y + row / 2 + 4:.0f}" font-size="11">{esc(value_fmt.format(v))}</text>'
        )
    out.append(f'<line x1="{plot_l}" y1="{top}" x2="{plot_l}" y2="{bottom}" stroke="#555"/>')
    out.append(_xlabel(xlabel, height))
    out.append("</svg>")
    return "\n".join(out)

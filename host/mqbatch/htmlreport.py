"""One self-contained HTML file with inline SVG charts (no external assets, no
plotting dependency): used by the demo's report."""
from __future__ import annotations

import html
import math

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
W, H, PAD = 640, 260, 48


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _frame(title: str, ymax: float, xlabels: list[tuple[float, str]], ylabel: str) -> list[str]:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="14" font-weight="bold">{html.escape(title)}</text>',
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#333"/>',
           f'<line x1="{PAD}" y1="28" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>',
           f'<text x="12" y="{H / 2}" font-size="11" transform="rotate(-90 12 {H / 2})" '
           f'text-anchor="middle">{html.escape(ylabel)}</text>']
    for i in range(5):
        v = ymax * i / 4
        y = H - PAD - (H - PAD - 28) * i / 4
        out.append(f'<text x="{PAD - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{v:g}</text>')
        out.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - 10}" y2="{y:.1f}" stroke="#ddd"/>')
    for x, label in xlabels:
        out.append(f'<text x="{x:.1f}" y="{H - PAD + 14}" font-size="10" text-anchor="middle">{html.escape(label)}</text>')
    return out


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """series: name -> [(x, y), ...]"""
    xs = [x for pts in series.values() for x, _ in pts] or [0.0, 1.0]
    ys = [y for pts in series.values() for _, y in pts] or [1.0]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    ymax = _nice_max(max(ys))
    sx = lambda x: PAD + (W - 10 - PAD) * (x - x0) / (x1 - x0)
    sy = lambda y: H - PAD - (H - PAD - 28) * y / ymax
    ticks = [(sx(x0 + (x1 - x0) * i / 5), f"{x0 + (x1 - x0) * i / 5:.0f}") for i in range(6)]
    out = _frame(title, ymax, ticks, ylabel)
    out.append(f'<text x="{W / 2}" y="{H - 8}" font-size="11" text-anchor="middle">{html.escape(xlabel)}</text>')
    for i, (name, pts) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        out.append(f'<text x="{W - 12}" y="{32 + 12 * i}" font-size="10" text-anchor="end" '
                   f'fill="{color}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(title: str, bars: list[tuple[str, float]], ylabel: str, fmt: str = "{:g}") -> str:
    ymax = _nice_max(max([v for _, v in bars] or [1.0]))
    n = max(len(bars), 1)
    slot = (W - 10 - PAD) / n
    labels = [(PAD + slot * (i + 0.5), name if len(name) <= 22 else name[:21] + "…") for i, (name, _) in enumerate(bars)]
    out = _frame(title, ymax, labels, ylabel)
    for i, (name, v) in enumerate(bars):
        h = (H - PAD - 28) * v / ymax
        x = PAD + slot * i + slot * 0.15
        out.append(f'<rect x="{x:.1f}" y="{H - PAD - h:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
                   f'fill="{PALETTE[i % len(PALETTE)]}"><title>{html.escape(name)}: {fmt.format(v)}</title></rect>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{H - PAD - h - 3:.1f}" font-size="10" '
                   f'text-anchor="middle">{html.escape(fmt.format(v))}</text>')
    if not bars:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" font-size="12">none</text>')
    out.append("</svg>")
    return "\n".join(out)


def histogram(title: str, values: list[float], bins: int, xlabel: str) -> str:
    if not values:
        return bar_chart(title, [], "count")
    lo, hi = min(values), max(values)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    ymax = _nice_max(max(counts))
    slot = (W - 10 - PAD) / bins
    ticks = [(PAD + slot * i, f"{lo + width * i:.0f}") for i in range(0, bins + 1, max(1, bins // 6))]
    out = _frame(title, ymax, ticks, "records")
    out.append(f'<text x="{W / 2}" y="{H - 8}" font-size="11" text-anchor="middle">{html.escape(xlabel)}</text>')
    for i, c in enumerate(counts):
        h = (H - PAD - 28) * c / ymax
        out.append(f'<rect x="{PAD + slot * i:.1f}" y="{H - PAD - h:.1f}" width="{max(slot - 1, 1):.1f}" '
                   f'height="{h:.1f}" fill="{PALETTE[0]}"><title>{lo + width * i:.0f}..{lo + width * (i + 1):.0f}: '
                   f'{c}</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def page(title: str, sections: list[tuple[str, str]]) -> str:
    parts = [f"<h2>{html.escape(h)}</h2>\n{body}" for h, body in sections]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}"
            ".scroll{overflow-x:auto}table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;"
            "text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}"
            ".bad{color:#b00;font-weight:bold}.ok{color:#070;font-weight:bold}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>\n" + "\n".join(parts) + "\n</body></html>\n")

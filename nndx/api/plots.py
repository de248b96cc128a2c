"""Server-side SVG line charts for the report pages: no JavaScript, no CDN, no network.

``line_chart`` draws one or more series on linear or log axes. Points that cannot be
drawn are never silently dropped: a non-finite y (NaN/Inf — often the most important
datum in a report) is marked by a red cross at the top edge at its x, a non-positive
value on a log axis is counted, and the chart says how many points were left out.
Lines break at such points instead of bridging them. Every piece of text is escaped:
series names and point labels are user-controlled (layer names).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from nndx.report import DiagnosticReport, LayerStats

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
WIDTH, HEIGHT = 640, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 36, 44


@dataclass
class Series:
    """One line: ``xs`` and ``ys`` of equal length; optional per-point ``labels`` (tooltips)."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    labels: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys):
            raise ValueError(f"series {self.name!r}: {len(self.xs)} xs but {len(self.ys)} ys")
        if self.labels is not None and len(self.labels) != len(self.xs):
            raise ValueError(f"series {self.name!r}: labels must match the points")


@dataclass
class _Axis:
    log: bool
    lo: float = 0.0
    hi: float = 1.0
    ticks: list[float] = field(default_factory=list)

    def fit(self, values: list[float]) -> None:
        lo, hi = min(values), max(values)
        if self.log:
            lo, hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
            if lo == hi:
                lo, hi = lo - 1, hi + 1
            step = max(1, math.ceil((hi - lo) / 6))
            self.ticks = [10.0**e for e in range(int(lo), int(hi) + 1, step)]
            self.lo, self.hi = float(lo), float(hi)
            return
        if lo == hi:
            lo, hi = lo - (abs(lo) or 1.0) * 0.5, hi + (abs(hi) or 1.0) * 0.5
        step = _nice_step((hi - lo) / 5)
        self.lo, self.hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
        count = round((self.hi - self.lo) / step)
        self.ticks = [self.lo + i * step for i in range(count + 1)]

    def unit(self, value: float) -> float:
        """Position of ``value`` in [0, 1] along the axis."""
        v = math.log10(value) if self.log else value
        return (v - self.lo) / (self.hi - self.lo)


def _nice_step(raw: float) -> float:
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10.0 * magnitude


def _fmt(value: float, log: bool) -> str:
    if log:
        exponent = round(math.log10(value))
        return f"{10.0**exponent:g}" if -2 <= exponent <= 3 else f"1e{exponent}"
    return f"{value:.4g}"


def _drawable(value: float, log: bool) -> bool:
    return math.isfinite(value) and (value > 0 or not log)


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    log_y: bool = False,
    plot_id: str = "",
    markers: bool = True,
    y_range: tuple[float, float] | None = None,
) -> str:
    """An ``<svg>`` element (a string) drawing ``series``; see the module docstring.

    ``y_range`` fixes the linear y axis (e.g. ``(0, 1)`` for fractions) instead of
    fitting it to the data."""
    x_axis, y_axis = _Axis(log_x), _Axis(log_y)
    xs = [x for s in series for x, y in zip(s.xs, s.ys) if _drawable(x, log_x) and _drawable(y, log_y)]
    ys = [y for s in series for x, y in zip(s.xs, s.ys) if _drawable(x, log_x) and _drawable(y, log_y)]
    nonfinite = sum(1 for s in series for y in s.ys if not math.isfinite(y))
    non_positive = sum(1 for s in series for y in s.ys if log_y and math.isfinite(y) and y <= 0)
    non_positive += sum(1 for s in series for x in s.xs if log_x and math.isfinite(x) and x <= 0)
    bad_x = sum(1 for s in series for x in s.xs if not math.isfinite(x))

    inner_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    inner_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" data-plot="{escape(plot_id)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{MARGIN_LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    if not xs:
        out.append(
            f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">'
            f"no drawable values ({nonfinite} non-finite)</text></svg>"
        )
        return "".join(out)
    x_axis.fit(xs)
    y_axis.fit(ys if y_range is None or log_y else [*ys, *y_range])

    def px(x: float) -> float:
        return MARGIN_LEFT + x_axis.unit(x) * inner_w

    def py(y: float) -> float:
        return MARGIN_TOP + (1.0 - y_axis.unit(y)) * inner_h

    bottom = MARGIN_TOP + inner_h
    out.append(
        f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{inner_w}" height="{inner_h}" '
        'fill="none" stroke="#999"/>'
    )
    for tick in x_axis.ticks:
        x = px(tick)
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#999"/>')
        out.append(
            f'<text x="{x:.1f}" y="{bottom + 16}" font-size="10" text-anchor="middle">{_fmt(tick, log_x)}</text>'
        )
    for tick in y_axis.ticks:
        y = py(tick)
        out.append(
            f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{MARGIN_LEFT + inner_w}" y2="{y:.1f}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{MARGIN_LEFT - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{_fmt(tick, log_y)}</text>'
        )
    out.append(
        f'<text x="{MARGIN_LEFT + inner_w / 2}" y="{HEIGHT - 6}" font-size="11" text-anchor="middle">'
        f"{escape(x_label)}{' (log)' if log_x else ''}</text>"
    )
    out.append(
        f'<text x="12" y="{MARGIN_TOP + inner_h / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 12 {MARGIN_TOP + inner_h / 2})">{escape(y_label)}{" (log)" if log_y else ""}</text>'
    )

    for index, s in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        segments: list[list[str]] = [[]]
        dots: list[str] = []
        for i, (x, y) in enumerate(zip(s.xs, s.ys)):
            label = s.labels[i] if s.labels is not None else f"{s.name}: x={x:g}"
            if not _drawable(x, log_x) or not _drawable(y, log_y):
                segments.append([])  # break the line, never bridge a missing point
                if _drawable(x, log_x) and not math.isfinite(y):
                    cx = px(x)
                    dots.append(
                        f'<g class="nonfinite"><title>{escape(label)}: {escape(str(y))}</title>'
                        f'<path d="M{cx - 4:.1f},{MARGIN_TOP - 4} l8,8 m0,-8 l-8,8" stroke="#d62728" '
                        'stroke-width="2"/></g>'
                    )
                continue
            cx, cy = px(x), py(y)
            segments[-1].append(f"{cx:.1f},{cy:.1f}")
            if markers:
                dots.append(
                    f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="{color}">'
                    f"<title>{escape(label)}: {y:.4g}</title></circle>"
                )
        for points in segments:
            if len(points) > 1:
                out.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(points)}"/>'
                )
            elif points and not markers:  # an isolated point between gaps would vanish
                cx, cy = points[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
        out.extend(dots)
        legend_y = MARGIN_TOP + 14 + 14 * index
        legend_x = MARGIN_LEFT + inner_w - 150
        out.append(f'<rect x="{legend_x}" y="{legend_y - 8}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{legend_x + 14}" y="{legend_y + 1}" font-size="11">{escape(s.name[:40])}</text>')

    notes = []
    if nonfinite:
        notes.append(f"{nonfinite} non-finite value{'s' if nonfinite != 1 else ''} not plotted (red ×)")
    if non_positive:
        notes.append(f"{non_positive} non-positive value{'s' if non_positive != 1 else ''} left off the log axis")
    if bad_x:
        notes.append(f"{bad_x} point{'s' if bad_x != 1 else ''} with a non-finite x not plotted")
    if notes:
        out.append(
            f'<text class="omitted" x="{WIDTH - MARGIN_RIGHT}" y="20" font-size="11" text-anchor="end" '
            f'fill="#d62728">{escape("; ".join(notes))}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def latest_per_layer(report: DiagnosticReport) -> list[LayerStats]:
    """The last recorded entry of each layer, layers in first-seen (forward) order."""
    latest: dict[str, LayerStats] = {}
    for layer in report.layers:
        previous = latest.get(layer.name)
        if previous is None or (layer.step or 0) >= (previous.step or 0):
            latest[layer.name] = layer
    return list(latest.values())


def report_charts(report: DiagnosticReport) -> dict[str, str]:
    """The charts a report has data for, by id: ``loss``, ``lr_range``, ``gradient_flow``,
    ``dead_units``, ``activation_std``. Each value is an ``<svg>`` string."""
    charts: dict[str, str] = {}
    if any(report.loss_history.values()):
        charts["loss"] = line_chart(
            [
                Series(split, [p.step for p in points], [p.value for p in points],
                       [f"{split} step {p.step}" for p in points])
                for split, points in report.loss_history.items()
                if points
            ],
            title="Loss", x_label="step", y_label="loss", plot_id="loss", markers=False,
        )
    lr_range = report.probes.lr_range if report.probes else None
    if lr_range is not None and lr_range.lrs and len(lr_range.lrs) == len(lr_range.losses):
        lr_series = [Series("loss", lr_range.lrs, lr_range.losses)]
        if len(lr_range.smoothed) == len(lr_range.lrs):
            lr_series.append(Series("smoothed", lr_range.lrs, lr_range.smoothed))
        charts["lr_range"] = line_chart(
            lr_series, title="LR range test", x_label="learning rate", y_label="loss",
            log_x=True, plot_id="lr_range",
        )
    layers = latest_per_layer(report)
    with_gradient = [layer for layer in layers if layer.gradient is not None]
    if with_gradient:
        index = list(range(len(with_gradient)))
        names = [f"{i}: {layer.name}" for i, layer in enumerate(with_gradient)]
        charts["gradient_flow"] = line_chart(
            [
                Series("gradient norm", index, [layer.gradient.norm for layer in with_gradient], names),
                Series("gradient |mean|", index, [layer.gradient.abs_mean for layer in with_gradient], names),
            ],
            title="Gradient flow per layer (input → output)", x_label="layer (forward order)",
            y_label="gradient", log_y=True, plot_id="gradient_flow",
        )
    with_activation = [layer for layer in layers if layer.activation is not None]
    if with_activation:
        index = list(range(len(with_activation)))
        names = [f"{i}: {layer.name}" for i, layer in enumerate(with_activation)]
        charts["dead_units"] = line_chart(
            [Series("dead-unit fraction", index, [layer.activation.dead_unit_fraction for layer in with_activation], names)],
            title="Dead units per layer", x_label="layer (forward order)", y_label="fraction",
            plot_id="dead_units", y_range=(0.0, 1.0),
        )
        charts["activation_std"] = line_chart(
            [Series("activation std", index, [layer.activation.std for layer in with_activation], names)],
            title="Activation std per layer", x_label="layer (forward order)", y_label="std",
            log_y=True, plot_id="activation_std",
        )
    return charts

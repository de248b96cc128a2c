"""Every figure of a report, built once from the report, as plotly figure specs.

The service's pages and ``nndx plot`` draw the same figures. A figure's ``spec`` is a
plain dict in plotly's JSON figure format (``{"data": [traces], "layout": {...}}``),
drawn by plotly.js: the pages load the bundle that ships inside the plotly package
from the service itself, ``nndx plot`` writes it beside its HTML. Building dicts, not
``plotly.graph_objects``, keeps a figure to about a millisecond and the service free of
plotly's Python import; the tests validate every spec with ``plotly.graph_objects``.

What every figure promises, whatever a report that validates holds:

- Nothing is left off. NaN and +inf are drawn as ✕ at the top edge (-inf at the
  bottom), zero and negative values on a log axis as ▼ at the axis floor, values beyond
  ±1e290 (or below 1e-290 on a log axis) at that limit; each such point's hover text
  gives its true value, and the figure's ``notes`` count them.
- A log axis when the positive values span three decades or more and none is
  negative, else linear; a log/linear switch on the figure where both show every value.
- Layer and parameter names on the axis; per-layer quantities as bars, input layer at
  the top; per-layer series over steps as lines, or a heatmap when there are many.
- Steps where a live alert fired (``report.loop.live_findings``) are marked on every
  figure drawn against the training step.
- Text from the report (layer, split, run names) is escaped for plotly's pseudo-HTML.
- Only finite numbers: ``json.dumps(spec, allow_nan=False)`` never fails.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nndx.errors import MissingExtraError
from nndx.report import (
    CauseCode,
    DiagnosticReport,
    Finding,
    LayerStats,
    LRRangeResult,
    OverfitResult,
)
from nndx.views.text import num

Spec = dict[str, Any]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
SEVERITY_COLORS = {"error": "#d62728", "warning": "#e08a00", "info": "#7f7f7f"}
MARK_COLOR = "#d62728"
#: Finite values beyond these magnitudes are drawn at them: plotly.js computes axis
#: ranges in doubles, and a span of 2e308 is infinite.
LIMIT, TINY = 1e290, 1e-290
#: Positive values spanning at least this many decades get a log axis.
LOG_DECADES = 3.0
#: Per-layer series over steps draw as lines up to this many, as a heatmap beyond.
MAX_LINES = 20
#: ‖Δw‖/‖w‖ per step that training usually shows (a rule of thumb, drawn for reference).
TYPICAL_UPDATE_RATIO = 1e-3
MAX_LABEL_CHARS = 64
#: Bars carry their value as text up to this many rows.
MAX_LABELLED_ROWS = 40


@dataclass(frozen=True)
class Figure:
    """One figure: ``id`` is stable (an anchor on the page, a file name for the CLI);
    ``notes`` say what was drawn specially (non-finite values, zeros on a log axis)."""

    id: str
    title: str
    spec: Spec
    notes: tuple[str, ...] = ()
    steps: bool = False  # drawn against the training step (a finding's step can be marked on it)

    def to_json(self) -> str:
        """The spec as strict JSON (no NaN), safe inside ``<script type="application/json">``."""
        text = json.dumps(self.spec, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        # no "</script>", "<!--" or entity can end the script element early
        return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")

    @property
    def trace_count(self) -> int:
        return len(self.spec["data"])


# --------------------------------------------------------------------------- text


def escape(text: object) -> str:
    """Text from a report, safe in plotly's text (which reads ``<b>``, ``<a href>``, entities)."""
    return html.escape(str(text), quote=False)


def labels(names: Sequence[str]) -> list[str]:
    """Category labels for ``names``: escaped, shortened, never blank, and unique (a
    category axis merges equal labels, which would hide a layer)."""
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        label = name if len(name) <= MAX_LABEL_CHARS else name[: MAX_LABEL_CHARS - 1] + "…"
        label = escape(label) if label.strip() else "(blank)"
        candidate, n = label, 1
        while candidate in seen:
            n += 1
            candidate = f"{label} #{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


# --------------------------------------------------------------------------- scales


@dataclass(frozen=True)
class Scale:
    """How one axis shows a set of values: log or linear, and where the values that
    cannot be drawn as themselves go (``place``)."""

    log: bool
    floor: float  # zero and negative values on a log axis
    top: float  # NaN and +inf
    bottom: float  # -inf
    switchable: bool  # both log and linear show every value
    constant: bool = False  # every finite value is the same

    @classmethod
    def of(cls, values: Iterable[float], log: bool | None = None) -> Scale:
        """The scale for ``values``; ``log`` forces the axis type (the LR axis is log)."""
        finite = [min(max(v, -LIMIT), LIMIT) for v in map(as_float, values) if math.isfinite(v)]
        positive = [max(v, TINY) for v in finite if v > 0]
        negative = any(v < 0 for v in finite)
        if log is None:
            log = (
                len(positive) >= 2
                and not negative
                and math.log10(max(positive)) - math.log10(min(positive)) >= LOG_DECADES
            )
        if log:
            lo, hi = (math.log10(min(positive)), math.log10(max(positive))) if positive else (-1.0, 1.0)
            pad = max(0.08 * (hi - lo), 0.3)
            floor = 10 ** max(lo - pad, -300.0)
            return cls(True, floor, 10 ** min(hi + pad, 300.0), floor, switchable=not negative)
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi) * 0.1, 1.0)
        return cls(False, 0.0, hi + pad, lo - pad, switchable=bool(finite) and len(positive) == len(finite),
                   constant=bool(finite) and hi == lo)

    def place(self, value: float) -> tuple[float, str | None]:
        """Where ``value`` is drawn, and why it is marked (None: drawn as itself)."""
        value = as_float(value)
        if math.isnan(value) or value == math.inf:
            return self.top, "nonfinite"
        if value == -math.inf:
            return self.bottom, "nonfinite"
        if self.log and value <= 0:
            return self.floor, "floor"
        if abs(value) > LIMIT:
            return math.copysign(LIMIT, value), "clipped"
        if self.log and value < TINY:
            return TINY, "clipped"
        return value, None


def as_float(value: float) -> float:
    """A count may be an integer beyond float range (a class count of 10**400): it is
    drawn at the limit, like any other value too large to draw."""
    try:
        return float(value)
    except OverflowError:
        return math.ldexp(1.0, 1023) if value > 0 else -math.ldexp(1.0, 1023)


def step_x(step: int) -> float:
    """A training step as an x coordinate (a step of 10**400 is drawn at the limit)."""
    return float(min(step, int(LIMIT)))


def axis_position(value: float, log: bool) -> float:
    """``value`` in the units plotly places an annotation in: log10 on a log axis (a shape
    takes the value itself)."""
    return math.log10(value) if log else value


MARKS = {
    # kind: (legend name, marker symbol, note template)
    "nonfinite": ("NaN / ±inf (at the edge)", "x", "{n} NaN/inf value{s} drawn as ✕ at the edge"),
    "floor": ("zero or negative (at the log floor)", "triangle-down", "{n} zero or negative value{s} drawn as ▼ at the floor of the log axis"),
    "clipped": ("beyond ±1e290 (at the limit)", "diamond-open", "{n} value{s} beyond the drawable range drawn at its limit"),
    "zero": ("zero", "line-ns", "{n} zero value{s} marked | at 0"),
}  # fmt: skip


@dataclass
class _Marks:
    """The specially drawn points of one figure: one trace per kind (and per line colour,
    so that in an overlay of runs each ✕ says whose it is)."""

    points: dict[tuple[str, str | None], tuple[list[Any], list[Any], list[str]]] = field(default_factory=dict)

    def add(self, kind: str | None, x: Any, y: Any, text: str, color: str | None = None) -> None:
        if kind is not None:
            xs, ys, texts = self.points.setdefault((kind, color), ([], [], []))
            xs.append(x)
            ys.append(y)
            texts.append(text)

    def traces(self) -> list[Spec]:
        out = []
        for (kind, color), (xs, ys, texts) in self.points.items():
            name, symbol, _ = MARKS[kind]
            shade = color or (MARK_COLOR if kind == "nonfinite" else "#444")
            out.append({
                "type": "scatter", "mode": "markers", "name": name, "x": xs, "y": ys, "text": texts,
                "hovertemplate": "%{text}<extra></extra>", "showlegend": color is None,
                "marker": {"symbol": symbol, "size": 10, "color": shade, "line": {"width": 2, "color": shade}},
            })  # fmt: skip
        return out

    def notes(self) -> tuple[str, ...]:
        counts: dict[str, int] = {}
        for (kind, _), (xs, _, _) in self.points.items():
            counts[kind] = counts.get(kind, 0) + len(xs)
        return tuple(MARKS[kind][2].format(n=n, s="" if n == 1 else "s") for kind, n in counts.items())


def _switch(axis: str, scale: Scale) -> list[Spec]:
    """A log/linear menu for ``axis`` ("yaxis"/"xaxis"), where both show every value."""
    if not scale.switchable:
        return []
    order = ("log", "linear") if scale.log else ("linear", "log")
    name = axis[0]
    return [{
        "type": "dropdown", "showactive": True, "active": 0, "x": 1.0, "xanchor": "right", "y": 1.0,
        "yanchor": "bottom", "pad": {"r": 0, "t": 0, "b": 4}, "font": {"size": 11}, "bgcolor": "#ffffff",
        "bordercolor": "#d0d4da",
        "buttons": [{"label": f"{kind} {name}", "method": "relayout", "args": [{f"{axis}.type": kind}]} for kind in order],
    }]  # fmt: skip


#: Axis style. Exponents print as "1e-5", like ``num``: plotly's default superscripts
#: need an inline style attribute, which the pages' CSP does not allow.
AXIS: Spec = {"gridcolor": "#eef0f3", "zeroline": False, "automargin": True, "exponentformat": "e"}


def _layout(title: str, x_title: str, y_title: str, *, height: int = 320) -> Spec:
    return {
        "title": {"text": escape(title), "x": 0.0, "xanchor": "left", "font": {"size": 14}},
        "height": height,
        "margin": {"l": 64, "r": 16, "t": 48, "b": 40},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12, "color": "#1f2328"},
        "colorway": list(PALETTE),
        "legend": {"orientation": "h", "x": 0.0, "xanchor": "left", "y": 0.0, "yanchor": "bottom", "yref": "container",
                   "font": {"size": 11}},
        "xaxis": {"title": {"text": escape(x_title)}, **AXIS},
        "yaxis": {"title": {"text": escape(y_title)}, **AXIS},
        "hoverlabel": {"font": {"size": 11}},
    }  # fmt: skip


# --------------------------------------------------------------------------- live alerts


@dataclass(frozen=True)
class Event:
    """A step worth marking: a live alert that fired there."""

    step: int
    severity: str
    code: str
    title: str


def events(report: DiagnosticReport) -> list[Event]:
    """The live alerts of the run, in firing order."""
    if report.loop is None:
        return []
    return [Event(f.step, f.severity, f.code, f.title) for f in report.loop.live_findings]


def _mark_events(layout: Spec, marks: Sequence[Event]) -> None:
    """Vertical lines at the steps where alerts fired, a flag on top with the alerts' titles."""
    by_step: dict[int, list[Event]] = {}
    for event in marks:
        by_step.setdefault(event.step, []).append(event)
    shapes, annotations = layout.setdefault("shapes", []), layout.setdefault("annotations", [])
    for step, fired in by_step.items():
        worst = max(fired, key=lambda e: {"info": 0, "warning": 1, "error": 2}.get(e.severity, 0))
        color = SEVERITY_COLORS.get(worst.severity, "#7f7f7f")
        x = step_x(step)
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": color, "width": 1, "dash": "dot"}})  # fmt: skip
        annotations.append({
            "x": x, "xref": "x", "y": 1.0, "yref": "paper", "yanchor": "bottom", "showarrow": False,
            "text": "⚑", "font": {"color": color, "size": 13},
            "hovertext": "<br>".join(f"step {num(e.step)} · {escape(e.severity)} · {escape(e.code)}: {escape(e.title)}"
                                     for e in fired),
        })  # fmt: skip


# --------------------------------------------------------------------------- builders


@dataclass
class Line:
    """One line of a figure: ``xs`` are steps (or learning rates), ``ys`` values."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    x_text: Sequence[str]  # how each x reads in the hover text ("step 120")
    color: str | None = None
    dash: str | None = None
    group: str | None = None


def line_figure(
    fig_id: str,
    title: str,
    lines: Sequence[Line],
    *,
    x_title: str = "step",
    y_title: str = "",
    x_log: bool = False,
    y_log: bool | None = None,
    marks: Sequence[Event] = (),
    y_range: tuple[float, float] | None = None,
) -> Figure | None:
    """Lines over steps (or over a log x axis: the LR sweep); None when there is no point."""
    lines = [line for line in lines if len(line.xs)]
    if not lines:
        return None
    y_scale = Scale.of((y for line in lines for y in line.ys), log=y_log)
    x_scale = Scale.of((x for line in lines for x in line.xs), log=True) if x_log else None
    special = _Marks()
    traces = []
    for line in lines:
        order = sorted(range(len(line.xs)), key=lambda i: _sort_key(line.xs[i]))
        xs, ys, texts = [], [], []
        for i in order:
            x_raw, y_raw = line.xs[i], line.ys[i]
            x, x_kind = x_scale.place(x_raw) if x_scale else (x_raw, None)
            y, y_kind = y_scale.place(y_raw)
            text = f"{escape(line.name)} · {line.x_text[i]}<br>{escape(y_title) or 'value'} {num(y_raw)}"
            kind = x_kind or y_kind
            special.add(kind, x, y, text, line.color)
            # a gap where the value is not a number: a line never bridges a missing point
            xs.append(x)
            ys.append(None if kind == "nonfinite" else y)
            texts.append(text)
        style: Spec = {"width": 1.6}
        if line.color:
            style["color"] = line.color
        if line.dash:
            style["dash"] = line.dash
        trace = {
            "type": "scatter", "mode": "lines+markers" if len(xs) <= 60 else "lines", "name": escape(line.name),
            "x": xs, "y": ys, "text": texts, "hovertemplate": "%{text}<extra></extra>", "line": style,
            "marker": {"size": 5}, "connectgaps": False,
        }  # fmt: skip
        if line.color:
            trace["marker"]["color"] = line.color
        if line.group:
            trace["legendgroup"] = escape(line.group)
        traces.append(trace)
    layout = _layout(title, x_title, y_title)
    layout["yaxis"]["type"] = "log" if y_scale.log else "linear"
    if y_range is None and not y_scale.log and y_scale.constant:
        y_range = (y_scale.bottom, y_scale.top)  # plotly's own range for one value hides where it is
    if y_range is not None:
        layout["yaxis"]["range"] = list(y_range)
    if x_scale is not None:
        layout["xaxis"]["type"] = "log"
    layout["hovermode"] = "closest"
    layout["updatemenus"] = _switch("yaxis", y_scale) if y_range is None else []
    if marks and x_scale is None:
        _mark_events(layout, marks)
    spec = {"data": traces + special.traces(), "layout": layout}
    return Figure(fig_id, title, spec, special.notes(), steps=x_scale is None and x_title == "step")


def _sort_key(x: float) -> float:
    return x if not math.isnan(x) else math.inf


def bar_figure(
    fig_id: str,
    title: str,
    names: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    value_title: str,
    log: bool | None = None,
    value_range: tuple[float, float] | None = None,
    reference: tuple[float, str] | None = None,
) -> Figure | None:
    """Horizontal bars, one row per name (input layer at the top), one bar per series."""
    if not names:
        return None
    scale = Scale.of((v for _, values in series for v in values), log=log)
    rows = labels(names)
    special = _Marks()
    traces = []
    show_values = len(rows) <= MAX_LABELLED_ROWS  # the value beside each bar, 0 included
    for index, (series_name, values) in enumerate(series):
        xs, texts, shown = [], [], []
        for label, value in zip(rows, values):
            x, kind = scale.place(value)
            text = f"{label}<br>{escape(series_name)} {num(value)}"
            if kind is None and value == 0 and not show_values:
                kind = "zero"  # a bar of length 0 is invisible
            special.add(kind, x, label, text)
            xs.append(None if kind in ("nonfinite", "floor") else x)  # the marker alone says where it is
            texts.append(text)
            shown.append(num(value) if kind is None else "")
        trace = {
            "type": "bar", "orientation": "h", "name": escape(series_name), "y": rows, "x": xs, "customdata": texts,
            "hovertemplate": "%{customdata}<extra></extra>", "marker": {"color": PALETTE[index % len(PALETTE)]},
            "cliponaxis": False,
        }  # fmt: skip
        if show_values:
            trace.update({"text": shown, "textposition": "outside", "textfont": {"size": 10}})
        else:
            trace["textposition"] = "none"
        traces.append(trace)
    per_row = 18 if len(series) == 1 else 14 * len(series)
    layout = _layout(title, value_title, "", height=int(min(max(140 + per_row * len(rows), 260), 1600)))
    layout["yaxis"].update({"type": "category", "categoryorder": "array", "categoryarray": rows,
                            "autorange": "reversed", "title": {"text": ""}})  # fmt: skip
    layout["xaxis"]["type"] = "log" if scale.log else "linear"
    if value_range is not None:
        layout["xaxis"]["range"] = list(value_range)
    layout["barmode"] = "group"
    layout["hovermode"] = "closest"
    layout["updatemenus"] = _switch("xaxis", scale) if value_range is None else []
    if reference is not None:
        at, text = reference
        layout["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": at, "x1": at, "y0": 0, "y1": 1,
                             "line": {"color": "#666", "width": 1, "dash": "dash"}}]  # fmt: skip
        layout["annotations"] = [{"x": axis_position(at, scale.log), "xref": "x", "y": 1, "yref": "paper", "yanchor": "bottom",
                                  "showarrow": False, "text": escape(text), "font": {"size": 10, "color": "#666"}}]  # fmt: skip
    return Figure(fig_id, title, {"data": traces + special.traces(), "layout": layout}, special.notes())


def per_layer_over_steps(
    fig_id: str,
    title: str,
    series: dict[str, list[tuple[int, float]]],
    *,
    y_title: str,
    marks: Sequence[Event] = (),
    y_range: tuple[float, float] | None = None,
) -> Figure | None:
    """One series per layer (or parameter) over the recorded steps: lines when there are
    at most MAX_LINES, else a heatmap (rows in forward order, columns by step)."""
    series = {name: points for name, points in series.items() if points}
    if not series or len({step for points in series.values() for step, _ in points}) < 2:
        return None  # one recorded step: the per-layer bars show it
    if len(series) <= MAX_LINES:
        lines = [
            Line(name, [step_x(s) for s, _ in points], [v for _, v in points], [f"step {num(s)}" for s, _ in points])
            for name, points in series.items()
        ]
        return line_figure(fig_id, title, lines, y_title=y_title, marks=marks, y_range=y_range,
                           y_log=False if y_range else None)  # fmt: skip
    return _heatmap(fig_id, title, series, y_title=y_title, marks=marks, fixed=y_range)


def _heatmap(
    fig_id: str,
    title: str,
    series: dict[str, list[tuple[int, float]]],
    *,
    y_title: str,
    marks: Sequence[Event],
    fixed: tuple[float, float] | None,
) -> Figure:
    steps = sorted({step for points in series.values() for step, _ in points})
    column = {step: i for i, step in enumerate(steps)}
    scale = Scale.of((v for points in series.values() for _, v in points), log=False if fixed else None)
    rows = labels(list(series))
    special = _Marks()
    z: list[list[float | None]] = []
    texts: list[list[str]] = []
    for label, points in zip(rows, series.values()):
        z_row: list[float | None] = [None] * len(steps)
        t_row = [f"{label} · step {num(step)}: not recorded" for step in steps]
        for step, value in points:
            placed, kind = scale.place(value)
            text = f"{label} · step {num(step)}<br>{escape(y_title)} {num(value)}"
            special.add(kind, step_x(step), label, text)
            z_row[column[step]] = None if kind == "nonfinite" else (math.log10(placed) if scale.log else placed)
            t_row[column[step]] = text
        z.append(z_row)
        texts.append(t_row)
    colorbar_title = f"log10 {y_title}" if scale.log else y_title
    trace: Spec = {
        "type": "heatmap", "x": [step_x(s) for s in steps], "y": rows, "z": z, "text": texts,
        "hovertemplate": "%{text}<extra></extra>", "colorscale": "Viridis",
        "colorbar": {"title": {"text": escape(colorbar_title)}, "thickness": 12}, "hoverongaps": False,
    }  # fmt: skip
    if fixed is not None:
        trace["zmin"], trace["zmax"] = fixed
    layout = _layout(title, "step", "", height=int(min(max(140 + 12 * len(rows), 320), 1600)))
    layout["yaxis"].update({"type": "category", "autorange": "reversed", "title": {"text": ""}})
    if marks:
        _mark_events(layout, marks)
    spec = {"data": [trace, *special.traces()], "layout": layout}
    return Figure(fig_id, title, spec, special.notes(), steps=True)


# --------------------------------------------------------------------------- a report's figures


def latest_per_layer(report: DiagnosticReport) -> list[LayerStats]:
    """The last recorded entry of each layer, layers in first-seen (forward) order."""
    latest: dict[str, LayerStats] = {}
    for layer in report.layers:
        previous = latest.get(layer.name)
        if previous is None or (layer.step or 0) >= (previous.step or 0):
            latest[layer.name] = layer
    return list(latest.values())


def _loss(report: DiagnosticReport, marks: Sequence[Event]) -> Figure | None:
    lines = [
        Line(split, [step_x(p.step) for p in points], [p.value for p in points],
             [f"step {num(p.step)}" for p in points], dash=None if split == "train" else "dot")
        for split, points in report.loss_history.items()
    ]  # fmt: skip
    return line_figure("loss", "Loss", lines, y_title="loss", marks=marks)


def _accuracy(report: DiagnosticReport, marks: Sequence[Event]) -> Figure | None:
    lines = []
    for split, points in report.loss_history.items():
        measured = [p for p in points if p.accuracy is not None]
        lines.append(Line(split, [step_x(p.step) for p in measured], [p.accuracy for p in measured],  # type: ignore[misc]
                          [f"step {num(p.step)}" for p in measured]))  # fmt: skip
    return line_figure("accuracy", "Accuracy", lines, y_title="accuracy", marks=marks, y_log=False)


def _grad_norm(report: DiagnosticReport, marks: Sequence[Event]) -> Figure | None:
    history = report.loop.grad_norm_history if report.loop else []
    steps = [step_x(p.step) for p in history]
    texts = [f"step {num(p.step)}" for p in history]
    lines = [Line("before clipping", steps, [p.before_clip for p in history], texts)]
    clipped = [p for p in history if p.after_clip is not None]
    if clipped:
        lines.append(Line("after clipping", [step_x(p.step) for p in clipped], [p.after_clip for p in clipped],  # type: ignore[misc]
                          [f"step {num(p.step)}" for p in clipped], dash="dot"))  # fmt: skip
    return line_figure("grad_norm", "Global gradient norm", lines, y_title="‖g‖", marks=marks)


def _lr(report: DiagnosticReport, marks: Sequence[Event]) -> Figure | None:
    history = report.loop.lr_history if report.loop else []
    groups = max((len(p.lrs) for p in history), default=0)
    lines = []
    for group in range(groups):
        points = [p for p in history if len(p.lrs) > group]
        name = "lr" if groups == 1 else f"param group {group}"
        lines.append(Line(name, [step_x(p.step) for p in points], [p.lrs[group] for p in points],
                          [f"step {num(p.step)}" for p in points]))  # fmt: skip
    return line_figure("lr", "Learning rate", lines, y_title="learning rate", marks=marks)


def _input_norm(report: DiagnosticReport, marks: Sequence[Event]) -> Figure | None:
    history = report.loop.input_norm_history if report.loop else []
    line = Line("input norm", [step_x(p.step) for p in history], [p.value for p in history],
                [f"step {num(p.step)}" for p in history])  # fmt: skip
    return line_figure("input_norm", "Input norm per batch", [line], y_title="‖x‖", marks=marks)


def _update_ratio_steps(report: DiagnosticReport, marks: Sequence[Event]) -> Figure | None:
    series: dict[str, list[tuple[int, float]]] = {}
    for p in report.parameters:
        if p.update_ratio is not None and p.step is not None:
            series.setdefault(p.name, []).append((p.step, p.update_ratio))
    return per_layer_over_steps("update_ratio_steps", "Update ratio ‖Δw‖/‖w‖ per parameter", series,
                                y_title="update ratio", marks=marks)  # fmt: skip


def _dead_units_steps(report: DiagnosticReport, marks: Sequence[Event]) -> Figure | None:
    series: dict[str, list[tuple[int, float]]] = {}
    for layer in report.layers:
        if layer.activation is not None and layer.step is not None:
            series.setdefault(layer.name, []).append((layer.step, layer.activation.dead_unit_fraction))
    return per_layer_over_steps("dead_units_steps", "Dead units per layer over training", series,
                                y_title="dead-unit fraction", marks=marks, y_range=(-0.02, 1.02))  # fmt: skip


def _gradient_flow(layers: list[LayerStats]) -> Figure | None:
    with_gradient = [layer for layer in layers if layer.gradient is not None]
    return bar_figure(
        "gradient_flow", "Gradient flow per layer (input at the top)", [layer.name for layer in with_gradient],
        [("gradient norm", [layer.gradient.norm for layer in with_gradient]),  # type: ignore[union-attr]
         ("gradient |mean|", [layer.gradient.abs_mean for layer in with_gradient])],  # type: ignore[union-attr]
        value_title="gradient w.r.t. the layer's output",
    )  # fmt: skip


def _dead_units(layers: list[LayerStats]) -> Figure | None:
    measured = [layer for layer in layers if layer.activation is not None]
    return bar_figure(
        "dead_units", "Dead units per layer (zero for every sample)", [layer.name for layer in measured],
        [("dead-unit fraction", [layer.activation.dead_unit_fraction for layer in measured])],  # type: ignore[union-attr]
        value_title="fraction of units", log=False, value_range=(0.0, 1.0),
    )  # fmt: skip


def _activation_std(layers: list[LayerStats]) -> Figure | None:
    measured = [layer for layer in layers if layer.activation is not None]
    return bar_figure(
        "activation_std", "Activation std per layer", [layer.name for layer in measured],
        [("activation std", [layer.activation.std for layer in measured])],  # type: ignore[union-attr]
        value_title="std of the layer's output",
    )  # fmt: skip


def _update_ratio(report: DiagnosticReport) -> Figure | None:
    latest: dict[str, tuple[int, float]] = {}
    for p in report.parameters:
        if p.update_ratio is not None and (p.name not in latest or (p.step or 0) >= latest[p.name][0]):
            latest[p.name] = (p.step or 0, p.update_ratio)
    return bar_figure(
        "update_ratio", "Update ratio per parameter (last recorded step)", list(latest),
        [("‖Δw‖/‖w‖", [ratio for _, ratio in latest.values()])], value_title="update ratio",
        reference=(TYPICAL_UPDATE_RATIO, "~1e-3 typical"),
    )  # fmt: skip


def lr_range_figure(result: LRRangeResult | None) -> Figure | None:
    """The LR sweep: loss and smoothed loss against the learning rate (log axis), the
    suggestion, the interval of good learning rates when the result has one, and the
    point where the loss diverged."""
    if result is None or not result.lrs:
        return None
    lines = []
    for name, values, color in (("loss", result.losses, "#9aa4b1"), ("smoothed loss", result.smoothed, PALETTE[0])):
        n = min(len(result.lrs), len(values))  # a sweep read from elsewhere may disagree in length
        lines.append(Line(name, result.lrs[:n], values[:n], [f"lr {num(lr)}" for lr in result.lrs[:n]], color=color))
    figure = line_figure("lr_range", "Learning-rate range test", lines, x_title="learning rate", y_title="loss",
                         x_log=True)  # fmt: skip
    unpaired = max(len(result.losses), len(result.smoothed)) - len(result.lrs)
    if figure is not None and unpaired > 0:
        note = f"{unpaired} loss value{'s' if unpaired != 1 else ''} without a learning rate not drawn"
        figure = Figure(figure.id, figure.title, figure.spec, (*figure.notes, note))
    if figure is None:
        return None
    layout = figure.spec["layout"]
    x_scale = Scale.of(result.lrs, log=True)
    shapes, annotations = layout.setdefault("shapes", []), layout.setdefault("annotations", [])
    interval = _interval(result)
    if interval is not None:
        lo, hi = (x_scale.place(v)[0] for v in interval)
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": lo, "x1": hi, "y0": 0, "y1": 1,
                       "fillcolor": "rgba(44,160,44,0.12)", "line": {"width": 0}, "layer": "below"})  # fmt: skip
        annotations.append({"x": (math.log10(lo) + math.log10(hi)) / 2, "xref": "x", "y": 1.0, "yref": "paper", "yanchor": "bottom",
                            "showarrow": False, "font": {"size": 10, "color": "#2ca02c"},
                            "text": f"trains well: {num(interval[0])} – {num(interval[1])}"})  # fmt: skip
    # only the suggestion is marked as one: the valley and min/10 readings often train slowly (bench/lr_suggestion.py)
    marks = [("suggested", result.suggested_lr, "#d62728", "solid"), ("diverged", result.diverged_at_lr, "#111", "dot")]
    for row, (name, lr, color, dash) in enumerate(m for m in marks if m[1] is not None):
        x = x_scale.place(lr)[0]  # type: ignore[arg-type]
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": color, "width": 1.5, "dash": dash}})  # fmt: skip
        annotations.append({"x": math.log10(x), "xref": "x", "y": 0.98 - 0.08 * row, "yref": "paper", "xanchor": "left",
                            "showarrow": False, "bgcolor": "rgba(255,255,255,0.8)", "font": {"size": 10, "color": color},
                            "text": f"{name} {num(lr)}"})  # fmt: skip
    return figure


def _interval(result: LRRangeResult) -> tuple[float, float] | None:
    """The interval of learning rates that train well, when the result has a usable one."""
    lo, hi = result.interval_low_lr, result.interval_high_lr
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        return None
    return float(lo), float(hi)


def _overfit(result: OverfitResult | None) -> Figure | None:
    if result is None or not result.losses:
        return None
    steps = list(range(len(result.losses)))
    line = Line("loss on one batch", [float(s) for s in steps], result.losses, [f"step {s}" for s in steps])
    return line_figure("overfit", "Overfit one batch", [line], x_title="probe step", y_title="loss")


def _class_counts(report: DiagnosticReport) -> Figure | None:
    data = report.data
    splits = [(name, split) for name, split in (("train", data.train), ("test", data.test))
              if split is not None and split.class_counts] if data else []  # fmt: skip
    if not splits:
        return None
    classes = list(dict.fromkeys(c for _, split in splits for c in split.class_counts))
    return bar_figure(
        "class_counts", "Samples per class", [f"class {c}" for c in classes],
        [(name, [split.class_counts.get(c, 0) for c in classes]) for name, split in splits],
        value_title="samples", log=False,
    )  # fmt: skip


def _feature_std(report: DiagnosticReport) -> Figure | None:
    data = report.data
    splits = [(name, split) for name, split in (("train", data.train), ("test", data.test))
              if split is not None and split.feature_stds] if data else []  # fmt: skip
    if not splits:
        return None
    width = max(len(split.feature_stds) for _, split in splits)
    return bar_figure(
        "feature_std", "Input std per feature (per channel for images)", [f"feature {i}" for i in range(width)],
        [(name, list(split.feature_stds) + [math.nan] * (width - len(split.feature_stds))) for name, split in splits],
        value_title="std",
    )  # fmt: skip


#: The report page's sections and the figures in each, in order.
SECTIONS: dict[str, tuple[str, ...]] = {
    "training": ("loss", "accuracy", "grad_norm", "lr", "input_norm"),
    "layers": ("update_ratio_steps", "dead_units_steps", "gradient_flow", "dead_units", "activation_std", "update_ratio"),
    "probes": ("lr_range", "overfit"),
    "data": ("class_counts", "feature_std"),
}


def report_figures(report: DiagnosticReport) -> dict[str, Figure]:
    """Every figure the report has data for, by id, in the order of :data:`SECTIONS`."""
    marks = events(report)
    layers = latest_per_layer(report)
    probes = report.probes
    built = [
        _loss(report, marks), _accuracy(report, marks), _grad_norm(report, marks), _lr(report, marks),
        _input_norm(report, marks), _update_ratio_steps(report, marks), _dead_units_steps(report, marks),
        _gradient_flow(layers), _dead_units(layers), _activation_std(layers), _update_ratio(report),
        lr_range_figure(probes.lr_range if probes else None), _overfit(probes.overfit_one_batch if probes else None),
        _class_counts(report), _feature_std(report),
    ]  # fmt: skip
    return {figure.id: figure for figure in built if figure is not None}


def compare_figures(runs: Sequence[tuple[str, DiagnosticReport]]) -> dict[str, Figure]:
    """Loss, gradient norm and learning rate of several runs overlaid; one color per
    run, validation splits dotted. ``runs`` pairs a unique label with each report."""
    loss, grad, lr = [], [], []
    for index, (label, report) in enumerate(runs):
        color = PALETTE[index % len(PALETTE)]
        for split, points in report.loss_history.items():
            loss.append(Line(f"{label} · {split}", [step_x(p.step) for p in points], [p.value for p in points],
                             [f"step {num(p.step)}" for p in points], color=color,
                             dash=None if split == "train" else "dot", group=label))  # fmt: skip
        loop = report.loop
        if loop is not None:
            history = loop.grad_norm_history
            grad.append(Line(label, [step_x(p.step) for p in history], [p.before_clip for p in history],
                             [f"step {num(p.step)}" for p in history], color=color))  # fmt: skip
            groups = max((len(p.lrs) for p in loop.lr_history), default=0)
            for group in range(groups):
                points = [p for p in loop.lr_history if len(p.lrs) > group]
                lr.append(Line(label if groups == 1 else f"{label} · group {group}", [step_x(p.step) for p in points],
                               [p.lrs[group] for p in points], [f"step {num(p.step)}" for p in points],
                               color=color, dash=None if group == 0 else "dash", group=label))  # fmt: skip
    built = [
        line_figure("loss", "Loss", loss, y_title="loss"),
        line_figure("grad_norm", "Global gradient norm (before clipping)", grad, y_title="‖g‖"),
        line_figure("lr", "Learning rate", lr, y_title="learning rate"),
    ]
    return {figure.id: figure for figure in built if figure is not None}


# --------------------------------------------------------------------------- findings → figures

#: The figures that show the evidence of each cause, most direct first.
CAUSE_FIGURES: dict[CauseCode, tuple[str, ...]] = {
    CauseCode.LR_TOO_HIGH: ("loss", "update_ratio_steps", "grad_norm", "lr_range"),
    CauseCode.LR_TOO_LOW: ("loss", "update_ratio_steps", "lr_range"),
    CauseCode.NO_LR_SCHEDULE: ("loss", "lr"),
    CauseCode.LR_SCHEDULE_MISUSE: ("lr", "loss"),
    CauseCode.GRAD_CLIP_TOO_SMALL: ("grad_norm",),
    CauseCode.GRAD_ACCUM_SCALING: ("grad_norm", "loss"),
    CauseCode.DEAD_RELU: ("dead_units_steps", "dead_units"),
    CauseCode.VANISHING_GRADIENTS: ("gradient_flow", "update_ratio"),
    CauseCode.EXPLODING_GRADIENTS: ("grad_norm", "gradient_flow"),
    CauseCode.SATURATED_ACTIVATIONS: ("activation_std",),
    CauseCode.BAD_INIT: ("activation_std", "gradient_flow"),
    CauseCode.MISSING_ZERO_GRAD: ("grad_norm", "loss"),
    CauseCode.OPTIMIZER_NOT_CONNECTED: ("update_ratio", "update_ratio_steps"),
    CauseCode.DETACHED_GRAPH: ("gradient_flow", "update_ratio"),
    CauseCode.FROZEN_PARAMETERS: ("update_ratio",),
    CauseCode.UNNORMALIZED_INPUTS: ("input_norm", "feature_std"),
    CauseCode.SILENT_DATA_LOSS: ("input_norm",),
    CauseCode.CLASS_IMBALANCE: ("class_counts",),
    CauseCode.OVERFITTING: ("loss", "accuracy"),
    CauseCode.UNDERFITTING: ("loss", "accuracy", "overfit"),
    CauseCode.BATCH_TOO_SMALL: ("loss",),
    CauseCode.NUMERICAL_OVERFLOW: ("loss",),
    CauseCode.LOG_OF_ZERO: ("loss",),
    CauseCode.DIVISION_BY_ZERO: ("loss",),
    CauseCode.WRONG_LOSS: ("loss", "overfit"),
    CauseCode.LABELS_MISALIGNED: ("loss", "accuracy"),
    CauseCode.LABEL_NOISE: ("loss", "accuracy"),
}


def finding_target(finding: Finding, figures: dict[str, Figure], report: DiagnosticReport) -> tuple[str, int | None] | None:
    """The figure that shows a finding's evidence, and the step to look at: the step it
    first fired at (the finding's own, or the live alert of the same rule)."""
    figure_id = next((f for f in CAUSE_FIGURES.get(finding.code, ()) if f in figures), None)
    if figure_id is None:
        return None
    step = finding.step
    if step is None and report.loop is not None:
        step = next((f.step for f in report.loop.live_findings if f.rule_id == finding.rule_id), None)
    return figure_id, step


# --------------------------------------------------------------------------- files


def write_html(figures: dict[str, Figure], folder: str | Path, *, title: str) -> Path:
    """Write ``index.html`` with every figure, and ``plotly.min.js`` beside it: a
    folder that opens offline in any browser. Needs plotly (``pip install 'nndx[plot]'``)."""
    try:
        import plotly.io as pio
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise MissingExtraError("writing the plots needs plotly: pip install 'nndx[plot]'") from exc
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bundle = folder / "plotly.min.js"
    if not bundle.exists():
        bundle.write_text(get_plotlyjs(), encoding="utf-8")
    parts = []
    for figure in figures.values():
        body = pio.to_html(figure.spec, full_html=False, include_plotlyjs=False, div_id=f"fig-{figure.id}",
                           config={"displaylogo": False, "responsive": True}, validate=False)  # fmt: skip
        notes = "".join(f"<p class='note'>{html.escape(note)}</p>" for note in figure.notes)
        parts.append(f"<section id='{figure.id}'>{body}{notes}</section>")
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><script src='plotly.min.js'></script>"
        "<style>body{font-family:system-ui,sans-serif;max-width:72rem;margin:1rem auto;padding:0 1rem}"
        ".note{color:#b42318;font-size:.85rem;margin:.2rem 0 1rem}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>"
    )
    index = folder / "index.html"
    index.write_text(page, encoding="utf-8")
    return index

"""HTML pages: the run browser (runs filtered and paged, runs compared), one run's page,
and its prompt and checklist as HTML.

Server-rendered from jinja2 templates (autoescaped). Figures come from
:mod:`nndx.views.plots` as JSON in ``<script type="application/json">`` blocks, which
``/static/nndx.js`` hands to plotly.js. Every script is a file served by this service:
no inline script, no eval, no CDN — the pages work offline and under a
``script-src 'self'`` Content-Security-Policy. plotly's own CSS, which plotly.js would
inject as an inline ``<style>``, is read out of its bundle and served as a file, so the
pages need no inline style either.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from markdown_it import MarkdownIt

from nndx import __version__
from nndx.api.auth import get_scope
from nndx.api.deps import get_report, get_store
from nndx.api.models import error_responses
from nndx.api.storage import InvalidCursor, ReportStore, StoredReport
from nndx.prompts import render
from nndx.report import SEVERITY_ORDER, CauseCode, Diagnosis, DiagnosticReport, Finding
from nndx.views.plots import SECTIONS, Figure, compare_figures, finding_target, latest_per_layer, report_figures
from nndx.views.text import num, value_text

router = APIRouter(tags=["pages"])
#: A page that cannot show what was asked says why, as a page.
HTML_422 = {422: {"description": "a filter or selection the page cannot use; the page says which",
                  "content": {"text/html": {"schema": {"type": "string"}}}}}  # fmt: skip
INDEX_PAGE_SIZE = 50
MAX_COMPARE = 8
MAX_FILTER_CHARS = 1000
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

_environment = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parent.parent / "templates"), autoescape=True
)
_environment.filters["num"] = num
_environment.filters["evidence"] = value_text
_environment.globals["version"] = __version__
templates = Jinja2Templates(env=_environment)


# --------------------------------------------------------------------------- assets


@dataclass(frozen=True)
class PlotlyBundle:
    """plotly.js as shipped inside the plotly package, served from here (never a CDN)."""

    version: str
    js: bytes
    css: bytes

    @property
    def js_name(self) -> str:
        return f"plotly-{self.version}.min.js"

    @property
    def css_name(self) -> str:
        return f"plotly-{self.version}.css"


@lru_cache(maxsize=1)
def plotly_bundle() -> PlotlyBundle | None:
    """The bundle, or None when plotly is not installed (the pages then say so)."""
    spec = find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    if not path.is_file():
        return None
    js = path.read_bytes()
    match = re.search(rb"plotly\.js v([0-9][0-9A-Za-z.+-]*)", js[:500])
    version = match.group(1).decode() if match else hashlib.sha256(js).hexdigest()[:12]
    return PlotlyBundle(version, js, plotly_css(js.decode("utf-8", "replace")).encode())


_JS_STRING = r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')"""
_CSS_RULE = re.compile(r"(" + _JS_STRING[1:-1] + r"|[A-Za-z_$][\w$]*)\s*:\s*" + _JS_STRING)  # a minifier unquotes some keys


def plotly_css(bundle: str) -> str:
    """The global style rules plotly.js would inject into an inline ``<style>``, as CSS.

    The bundle keeps them in one object literal (``{"X,X div": "direction:ltr;...", ...}``)
    whose keys it expands (``X`` → ``.js-plotly-plot .plotly``, ``Y`` →
    ``.plotly-notifier``) before ``addStyleRule``. A ``<link id="plotly.js-style-global"
    class="no-inline-styles">`` tells plotly.js the rules are there already. Empty if the
    literal is not found (a plotly that changed its build): the plots then still draw,
    with an unstyled mode bar. The browser test checks this against what plotly injects.
    """
    start = bundle.find('{"X,X div"')
    end = bundle.find("}", start)
    if start < 0 or end < 0:
        return ""
    rules = []
    for key, value in _CSS_RULE.findall(bundle[start:end]):
        selector = _js_string(key)
        selector = (" ," + selector[1:]) if selector.startswith(",") else selector
        selector = selector.replace("X", ".js-plotly-plot .plotly").replace("Y", ".plotly-notifier")
        rules.append(f"{selector}{{{_js_string(value)}}}")
    return "\n".join(rules) + "\n"


def _js_string(literal: str) -> str:
    if literal[0] not in "'\"":
        return literal  # an identifier key
    body = literal[1:-1]
    return json.loads('"' + body.replace('\\"', '"').replace('"', '\\"') + '"') if "\\" in body else body


def _asset(request: Request, body: bytes, media_type: str) -> Response:
    """A versioned, immutable asset; gzip-compressed when the client accepts it."""
    headers = {"Cache-Control": "public, max-age=31536000, immutable", "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", "") and len(body) > 1024:
        headers["Content-Encoding"] = "gzip"
        body = _gzipped(body)
    return Response(body, media_type=media_type, headers=headers)


@lru_cache(maxsize=4)
def _gzipped(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=6, mtime=0)


@router.get("/vendor/{name}", include_in_schema=False)
def vendor(name: str, request: Request) -> Response:
    bundle = plotly_bundle()
    if bundle is not None and name == bundle.js_name:
        return _asset(request, bundle.js, "text/javascript; charset=utf-8")
    if bundle is not None and name == bundle.css_name:
        return _asset(request, bundle.css, "text/css; charset=utf-8")
    raise HTTPException(404, detail="not found")


def _page(request: Request, template: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    bundle = plotly_bundle()
    context = {"plotly": bundle, **context}
    return templates.TemplateResponse(request, template, context, status_code=status_code)


# --------------------------------------------------------------------------- run list


@dataclass(frozen=True)
class RunFilters:
    """The run list's filters as the form sent them, and what they mean for the store."""

    project: str | None = None
    q: str | None = None
    cause: str | None = None
    severity: str | None = None
    since: str | None = None
    until: str | None = None

    def form(self) -> dict[str, str]:
        """The filters as query parameters (for links that keep them)."""
        return {key: value for key, value in self.__dict__.items() if value}

    def store_kwargs(self) -> tuple[dict[str, Any], list[str]]:
        """Keyword arguments for ``ReportStore.list``, and what is wrong with the input."""
        problems = []
        for key, value in self.form().items():
            if "\x00" in value or len(value) > MAX_FILTER_CHARS:
                problems.append(f"{key}: at most {MAX_FILTER_CHARS} characters, and no NUL character")
        cause, severity = self.cause, self.severity
        if cause and cause not in CauseCode.__members__:
            problems.append(f"cause: {cause!r} is not a cause code")
            cause = None
        if severity and severity not in SEVERITY_ORDER:
            problems.append(f"severity: one of {', '.join(SEVERITY_ORDER)}")
            severity = None
        since, until = _moment(self.since, "since", problems), _moment(self.until, "until", problems, end=True)
        kwargs = {"project": self.project, "search": self.q, "cause": cause, "severity": severity,
                  "since": since, "until": until}  # fmt: skip
        return {key: value for key, value in kwargs.items() if value}, problems


def _moment(text: str | None, name: str, problems: list[str], *, end: bool = False) -> datetime | None:
    """A date (``2026-05-01``: that day, in UTC; the whole day for ``until``) or an ISO time."""
    if not text:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text) + timedelta(days=1 if end else 0)
            return datetime.combine(day, time(), tzinfo=timezone.utc)
        moment = datetime.fromisoformat(text)
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError):
        problems.append(f"{name}: a date such as 2026-05-01, or an ISO 8601 time")
        return None


#: The filters this store understands (the run-name search, severity and dates arrive
#: with the storage work on the service branch; until then the page says so).
STORE_FILTERS = frozenset(inspect.signature(ReportStore.list).parameters)


@router.get("/", response_class=HTMLResponse, responses=error_responses(401) | HTML_422, summary="Runs, filtered and paged")
def index(
    request: Request,
    project: str | None = Query(None, description="only this project"),
    q: str | None = Query(None, description="run name contains (case-insensitive)"),
    cause: str | None = Query(None, description="a cause code of any finding"),
    severity: str | None = Query(None, description="worst finding at least this severe"),
    since: str | None = Query(None, description="stored on or after (date or ISO time)"),
    until: str | None = Query(None, description="stored up to (date: that whole day)"),
    cursor: str | None = Query(None, description="next page"),
    scope: str | None = Depends(get_scope),
    store: ReportStore = Depends(get_store),
) -> HTMLResponse:
    filters = RunFilters(project, q, cause, severity, since, until)
    kwargs, problems = filters.store_kwargs()
    unsupported = sorted(key for key in kwargs if key not in STORE_FILTERS)
    problems += [f"{key}: this store cannot filter by it yet" for key in unsupported]
    page = None
    if not problems:
        try:
            page = store.list(scope=scope, limit=INDEX_PAGE_SIZE, cursor=cursor or None, **kwargs)
        except InvalidCursor:
            problems.append("cursor: not a page of this list; start from the first page")
    context = {
        "filters": filters,
        "problems": problems,
        "reports": page.items if page else [],
        "next_cursor": page.next_cursor if page else None,
        "first_page": not cursor,
        "causes": [code.value for code in CauseCode],
        "severities": list(SEVERITY_ORDER),
        "projects": [scope] if scope else [],
        "scoped": scope is not None,
    }
    return _page(request, "index.html", context, 422 if problems else 200)


# --------------------------------------------------------------------------- one run


#: Where the evidence of a cause that no figure shows is on the page.
CAUSE_SECTIONS = {
    **dict.fromkeys(("DATA_LEAKAGE", "DUPLICATE_SAMPLES", "NAN_IN_DATA", "LABEL_DTYPE", "UNNORMALIZED_TARGETS",
                     "UNSHUFFLED_DATA", "CLASS_IMBALANCE", "UNNORMALIZED_INPUTS"), ("data-checks", "Data checks")),
    **dict.fromkeys(("BROKEN_BACKWARD", "INPLACE_AUTOGRAD", "EVAL_MODE_FORGOTTEN", "DEVICE_MISMATCH",
                     "LABELS_MISALIGNED"), ("probe-status", "Probe status")),
    **dict.fromkeys(("MISSING_ACTIVATION", "WRONG_OUTPUT_ACTIVATION", "DOUBLE_SOFTMAX", "WRONG_LOSS",
                     "SHAPE_BROADCAST", "WRONG_RESHAPE"), ("model", "Model")),
}  # fmt: skip


def _findings(diagnosis: Diagnosis, figures: dict[str, Figure], report: DiagnosticReport) -> list[dict[str, Any]]:
    rows = []
    for finding in diagnosis.findings:
        target = finding_target(finding, figures, report)
        rows.append({"finding": finding, "figure": figures[target[0]] if target else None,
                     "step": target[1] if target else None,
                     "section": CAUSE_SECTIONS.get(finding.code.value)})  # fmt: skip
    return rows


def _scalars(model: Any, skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The fields of a result that read as one value (no lists), for a table cell."""
    out = []
    for name, value in model:
        if name in skip or value is None or isinstance(value, (list, dict)):
            continue
        out.append((name.replace("_", " "), value_text(value)))
    return out


def _probe_rows(report: DiagnosticReport) -> list[dict[str, Any]]:
    if report.probes is None:
        return []
    rows = []
    for name, result in report.probes:
        if result is not None:
            rows.append({"name": name.replace("_", " "), "id": name, "status": result.status,
                         "message": result.message, "values": _scalars(result, ("status", "message"))})  # fmt: skip
    return rows


SPLIT_FIELDS = (
    "n_samples", "checked_samples", "input_shape", "input_dtype", "input_mean", "input_std", "input_min",
    "input_max", "raw_range", "feature_scale_ratio", "constant_features", "input_nan_count", "input_inf_count",
    "label_dtype", "label_kind", "label_nan_count", "label_inf_count", "target_mean", "target_std",
    "imbalance_ratio", "missing_classes", "duplicate_count", "duplicate_fraction", "zero_sample_fraction",
    "label_runs_fraction", "target_order_correlation",
)  # fmt: skip


def _data_rows(report: DiagnosticReport) -> dict[str, Any] | None:
    data = report.data
    if data is None:
        return None
    splits = [(name, split) for name, split in (("train", data.train), ("test", data.test)) if split is not None]
    rows = []
    for field_name in SPLIT_FIELDS:
        values = [getattr(split, field_name) for _, split in splits]
        if all(v in (None, [], 0) for v in values) and field_name not in ("n_samples",):
            continue
        rows.append((field_name.replace("_", " "), [_cell(v) for v in values]))
    overall = [("train/test overlap", value_text(data.train_test_overlap)),
               ("overlap fraction", value_text(data.train_test_overlap_fraction)),
               ("expected classes", value_text(data.expected_num_classes))]  # fmt: skip
    return {"splits": [name for name, _ in splits], "rows": rows, "overall": overall}


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return "×".join(value_text(v) for v in value) if value and all(isinstance(v, int) for v in value) else value_text(value)
    return value_text(value)


def _last_finite(values: list[float]) -> float | None:
    return next((v for v in reversed(values) if v == v and abs(v) != float("inf")), None)


def _summary(report: DiagnosticReport, diagnosis: Diagnosis) -> list[tuple[str, str, str]]:
    """The cards at the top of a run: (label, value, detail)."""
    cards = []
    counts = {severity: sum(f.severity == severity for f in diagnosis.findings) for severity in ("error", "warning")}
    verdict = "healthy" if diagnosis.healthy else ", ".join(
        f"{n} {severity}{'s' if n != 1 else ''}" for severity, n in counts.items() if n)  # fmt: skip
    cards.append(("verdict", verdict, f"{diagnosis.rules_run} rules run"))
    for split, points in report.loss_history.items():
        if len(cards) >= 3:
            break
        values = [p.value for p in points]
        finite = [v for v in values if v == v and abs(v) != float("inf")]
        bad = len(values) - len(finite)
        detail = f"min {num(min(finite))}" if finite else "no finite value"
        cards.append((f"last {split} loss", num(_last_finite(values)) if finite else num(values[-1]) if values else "—",
                      detail + (f" · {bad} non-finite" if bad else "")))  # fmt: skip
    if report.loop is not None:
        loop = report.loop
        cards.append(("optimizer steps", num(loop.steps), f"{num(loop.backward_calls)} backward, {num(loop.zero_grad_calls)} zero_grad"))
        if loop.live_findings:
            first = loop.live_findings[0]
            cards.append(("live alerts", num(len(loop.live_findings)), f"first at step {num(first.step)}: {first.code}"))
    lr = report.probes.lr_range if report.probes else None
    if lr is not None:
        cards.append(("LR suggestion", num(lr.suggested_lr), lr.status if lr.suggested_lr is None else
                      f"trains well from {num(lr.interval_low_lr)} to {num(lr.interval_high_lr)}"))  # fmt: skip
    if report.model is not None:
        cards.append(("parameters", num(report.model.param_count), f"{num(report.model.trainable_param_count)} trainable"))
    return cards


SECTION_TITLES = {"training": "Training", "layers": "Layers", "probes": "Probes", "data": "Data"}


@router.get(
    "/reports/{report_id}", response_class=HTMLResponse, responses=error_responses(401, 404), summary="One run"
)
def report_page(request: Request, stored: StoredReport = Depends(get_report)) -> HTMLResponse:
    report = stored.report()
    diagnosis = stored.diagnosis()
    figures = report_figures(report)
    sections = [
        (section, SECTION_TITLES[section], [figures[f] for f in ids if f in figures]) for section, ids in SECTIONS.items()
    ]
    context = {
        "stored": stored,
        "report": report,
        "diagnosis": diagnosis,
        "findings": _findings(diagnosis, figures, report),
        "sections": sections,
        "probes": _probe_rows(report),
        "data": _data_rows(report),
        "layers": latest_per_layer(report),
        "summary": _summary(report, diagnosis),
        "worst": _worst(diagnosis.findings),
    }
    return _page(request, "report.html", context)


def _worst(findings: list[Finding]) -> str | None:
    return max((f.severity for f in findings), key=SEVERITY_ORDER.__getitem__, default=None)


# --------------------------------------------------------------------------- prompt and checklist

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
_markdown.disable("image")  # an image in report text would make the browser fetch its URL
# links within this service only: a link with a scheme (https:, javascript:, data:) stays text
_markdown.validateLink = lambda url: re.match(r"\s*[a-zA-Z][a-zA-Z0-9+.-]*:|\s*//", url) is None
MARKDOWN_FILES = {"prompt": "prompt-nn-debugger.md", "checklist": "skill-debug-checklist.md"}


def markdown_html(text: str) -> str:
    """Markdown as inert HTML: raw HTML in the text is shown as text, images are not
    rendered, and only links within this service (no scheme, no host) become links."""
    return _markdown.render(text)


def _markdown_page(request: Request, stored: StoredReport, kind: str) -> HTMLResponse:
    name = MARKDOWN_FILES[kind]
    text = render(report=stored.report(), diagnosis=stored.diagnosis())[name]
    context = {"stored": stored, "kind": kind, "file_name": name, "html": markdown_html(text)}
    return _page(request, "markdown.html", context)


@router.get("/reports/{report_id}/prompt", response_class=HTMLResponse, responses=error_responses(401, 404),
            summary="prompt-nn-debugger.md of a run, as HTML")  # fmt: skip
def prompt_page(request: Request, stored: StoredReport = Depends(get_report)) -> HTMLResponse:
    return _markdown_page(request, stored, "prompt")


@router.get("/reports/{report_id}/checklist", response_class=HTMLResponse, responses=error_responses(401, 404),
            summary="skill-debug-checklist.md of a run, as HTML")  # fmt: skip
def checklist_page(request: Request, stored: StoredReport = Depends(get_report)) -> HTMLResponse:
    return _markdown_page(request, stored, "checklist")


# --------------------------------------------------------------------------- compare


@router.get("/compare", response_class=HTMLResponse, responses=error_responses(401, 404) | HTML_422,
            summary="Runs compared: loss, gradient norm and learning rate overlaid")  # fmt: skip
def compare_page(
    request: Request,
    id: list[str] = Query([], description=f"2 to {MAX_COMPARE} report ids"),  # noqa: A002 - the form's field name
    scope: str | None = Depends(get_scope),
    store: ReportStore = Depends(get_store),
) -> HTMLResponse:
    ids = list(dict.fromkeys(i for i in id if i))
    if not 2 <= len(ids) <= MAX_COMPARE:
        context = {"problem": f"choose 2 to {MAX_COMPARE} runs to compare (got {len(ids)})"}
        return _page(request, "compare.html", context, 422)
    runs = []
    for report_id in ids:
        stored = store.get(report_id[:64], scope=scope)
        if stored is None:
            raise HTTPException(404, detail="report not found")
        runs.append(stored)
    reports = [(f"{stored.run_name or 'unnamed'} · {stored.id[:6]}", stored.report(), stored.diagnosis(), stored)
               for stored in runs]  # fmt: skip
    figures = compare_figures([(label, report) for label, report, _, _ in reports])
    causes = sorted({f.code.value for _, _, diagnosis, _ in reports for f in diagnosis.findings})
    matrix = [
        (code, [_worst([f for f in diagnosis.findings if f.code.value == code]) for _, _, diagnosis, _ in reports])
        for code in causes
    ]
    rows = [
        {"label": label, "stored": stored, "worst": _worst(diagnosis.findings),
         "loss": num(_last_finite([p.value for p in report.loss_history.get("train", [])])),
         "steps": num(report.loop.steps) if report.loop else "—"}
        for label, report, diagnosis, stored in reports
    ]  # fmt: skip
    return _page(request, "compare.html", {"runs": rows, "figures": figures, "matrix": matrix, "problem": None})

"""The self-contained HTML report of one run (F14).

    page = render_html_report(report_data(result=gaf.result, precision=prec))
    write_atomic("report.html", page)

One file, no network at view time: the style sheet, the data (JSON in a
``<script type="application/json">`` block, every ``<``, ``>`` and ``&`` written as a JSON
escape so that no name can close the block), the vendored graph layout (``@dagrejs/dagre``,
MIT, ``static/dagre.min.js``) and the page's own script (``static/report.js``) are all inline.
The tables are rendered here, every name through :func:`html.escape`; the script draws the
graphs from the JSON (text set with ``textContent`` only), and sorts and filters the tables.

Sections: summary (the safe-fusion summary: applied, rolled back with reasons, skipped by
reason), the graph before and after fusion (blocks collapse, groups click), the candidate
table, precision per output, per fusion, per layer and per value, estimated against measured
time per fusion (:mod:`graph_autofusion.report.html_chart`), and the hardware profile.
"""

from __future__ import annotations

import html
import json
import re
from functools import cache
from importlib import resources
from typing import Any

from graph_autofusion.renderers import register_renderer
from graph_autofusion.report.html_chart import timing_chart
from graph_autofusion.report.report_data import report_data

__all__ = ["DAGRE_VERSION", "analysis_page", "html_report", "render_html_report", "script_json"]

DAGRE_VERSION = "3.1.3"
e = html.escape


@cache
def _static(name: str) -> str:
    text = resources.files("graph_autofusion.report").joinpath("static", name).read_text("utf-8")
    text = re.sub(r"//# sourceMappingURL=\S+", "", text)  # nothing to fetch, ever
    if re.search(r"</script", text, re.IGNORECASE):  # would end the inline block early
        raise ValueError(f"static/{name} contains '</script'")
    return text


def script_json(data: Any) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">``: ``<``, ``>`` and
    ``&`` as ``\\u003c`` ``\\u003e`` ``\\u0026`` (no ``</script>``, no ``<!--``)."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _f(x: Any, fmt: str = ".2f") -> str:
    return format(x, fmt) if isinstance(x, int | float) and not isinstance(x, bool) else "?"


def _pct(x: Any) -> str:
    return f"{100 * x:+.1f}%" if isinstance(x, int | float) else "n/a"


def _pair(p: Any, fmt: str) -> str:
    return f"{_f(p[0], fmt)} \u2192 {_f(p[1], fmt)}" if isinstance(p, list | tuple) else "?"


def _num_td(text: str, sort: Any) -> str:
    v = sort if isinstance(sort, int | float) and not isinstance(sort, bool) else ""
    return f'<td class="n" data-v="{e(str(v))}">{e(text)}</td>'


def _table(head: list[tuple[str, str]], rows: list[str], attrs: str = "") -> str:
    ths = "".join(f'<th data-type="{t}">{e(h)}</th>' for h, t in head)
    return (
        f'<table class="sortable"{attrs}><thead><tr>{ths}</tr></thead><tbody>'
        + "".join(rows)
        + "</tbody></table>"
    )


# ----------------------------------------------------------------------------- sections
def _header(d: dict[str, Any]) -> str:
    sym = ", ".join(f"{k}={v}" for k, v in sorted(d["shapes"]["symbols"].items())) or "static"
    safe = {True: "on", False: "off", None: "not run (plan only)"}[d["safe_mode"]]
    return (
        f"<header><h1>{e(d['title'])}</h1><p>target {e(str(d['target']))} \u00b7 hardware "
        f"profile {e(str(d['profile']))} \u00b7 safe mode {e(safe)} \u00b7 strategy "
        f"{e(d['strategy'])} \u00b7 benefit threshold {_f(100 * d['benefit_threshold'], '.0f')}% "
        f"\u00b7 shapes {e(d['shapes']['method'])} ({e(sym)})</p></header>"
        '<nav><a href="#summary">Summary</a><a href="#graph-section">Graph</a>'
        '<a href="#candidates">Candidates</a><a href="#precision">Precision</a>'
        '<a href="#timing">Time</a><a href="#hardware">Hardware</a></nav>'
    )


def _summary(d: dict[str, Any]) -> str:
    s = d["summary"]
    e2e = s.get("end_to_end") or {}
    outs = e2e.get("outputs", e2e) if isinstance(e2e, dict) else {}
    cos = [v.get("cosine") for v in outs.values() if isinstance(v, dict)]
    cards = [
        ("candidates", s.get("candidates", 0)),
        ("planned", s.get("planned", 0)),
        ("fused", s.get("fused", "\u2013")),
        ("rolled back", s.get("rolled_back", "\u2013")),
        ("estimated improvement", _pct(s.get("estimated_improvement"))),
        ("measured on the fused subgraphs", _pct(s.get("measured_improvement"))),
        ("HBM access reduction", _pct(s.get("hbm_access_reduction")).lstrip("+")),
        ("end-to-end cosine", _f(min(cos), ".6f") if cos else "n/a"),
    ]
    out = ['<section id="summary"><h2>Safe-fusion summary</h2><div class="cards">']
    out += [f'<div class="card"><b>{e(str(v))}</b><span>{e(k)}</span></div>' for k, v in cards]
    out.append("</div>")
    tu = s.get("time_us") or [None, None]
    out.append(
        f"<p>Whole model, cost model on {e(str(d['profile']))}: {_f(tu[0])} \u00b5s \u2192 "
        f"{_f(tu[1])} \u00b5s; HBM accesses {_pair(s.get('hbm_accesses'), 'd')}.</p>"
    )
    if s.get("fused_ops"):
        ops = ", ".join(f"{e(k)} \u00d7{v}" for k, v in s["fused_ops"].items())
        out.append(f"<p><b>Applied:</b> {ops}</p>")
    rolled = [g for g in d["groups"] if g["status"] == "rolled-back"]
    if rolled:
        rows = [
            f'<tr data-group="{d["groups"].index(g)}"><td>{e(g["key"])}</td><td>{e(g["rule"])}'
            f'</td><td class="fail">{e(g["code"])}</td><td>{e(g["message"])}</td></tr>'
            for g in rolled
        ]
        out.append("<h3>Rolled back</h3>")
        head = [("fusion", "text"), ("rule", "text"), ("code", "text"), ("reason", "text")]
        out.append(_table(head, rows))
    elif d["kind"] == "fuse":
        out.append("<p>Rolled back: none.</p>")
    skipped = s.get("skipped") or s.get("by_code") or {}
    if skipped:
        rows = [f'<tr><td>{e(k)}</td><td class="n">{v}</td></tr>' for k, v in skipped.items()]
        out.append("<h3>Not fused, by reason</h3>")
        out.append(_table([("reason code", "text"), ("candidates", "num")], rows))
    if d["notes"]:
        out.append("<h3>Notes</h3><ul>" + "".join(f"<li>{e(n)}</li>" for n in d["notes"]))
        out.append("</ul>")
    out.append("</section>")
    return "".join(out)


def _graph(d: dict[str, Any]) -> str:
    g = d["graphs"]
    if not g["before"] and not g["after"]:
        return '<section id="graph-section"><h2>Graph</h2><p>No graph recorded.</p></section>'
    btn = []
    if g["before"]:
        btn.append(f'<button data-show="before">before fusion ({g["before"]["ops"]} ops)</button>')
    if g["after"]:
        btn.append(f'<button data-show="after">after fusion ({g["after"]["ops"]} ops)</button>')
    tools = "".join(
        f'<button data-act="{a}">{e(t)}</button>'
        for a, t in (
            ("expand", "expand all"),
            ("collapse", "collapse all"),
            ("fit", "fit"),
            ("zoomin", "+"),
            ("zoomout", "\u2212"),
        )
    )
    legend = (
        '<span class="legend"><span><i style="border-color:#1f8a3b"></i>fused</span>'
        '<span><i style="border-color:#b3261e;border-style:dashed"></i>rolled back</span>'
        '<span><i style="border-color:#2456a6"></i>planned</span>'
        '<span><i style="border-color:#6f8fc4;background:#eef3fb"></i>collapsed block</span></span>'
    )
    return (
        '<section id="graph-section"><h2>Graph</h2><div class="toolbar">'
        + "".join(btn)
        + tools
        + '<input id="graph-find" placeholder="find a node by name" size="24">'
        + legend
        + '</div><div id="graph-wrap"><div id="graph-box"><svg id="graph" '
        'aria-label="model graph"></svg><div id="graph-status">drawing\u2026</div></div>'
        '<aside id="details" data-kind="none"><h3>Details</h3><p class="muted">Click a fused '
        "group (outlined) for its operators, rule, estimate, verdict and precision; a block "
        "to expand or collapse it; a node for its name.</p></aside></div></section>"
    )


def _candidates(d: dict[str, Any]) -> str:
    head = [
        ("#", "num"),
        ("candidate", "text"),
        ("source", "text"),
        ("operators", "text"),
        ("HBM accesses", "num"),
        ("time \u00b5s", "num"),
        ("GFLOPS", "num"),
        ("local KiB need / capacity", "num"),
        ("verdict", "text"),
        ("outcome", "text"),
        ("reason", "text"),
    ]
    rows = []
    for i, c in enumerate(d["candidates"], 1):
        outcome = c["outcome"].split(":")[0]
        cls = {"fused": "o-fused", "rolled-back": "o-rolled", "planned": "o-planned"}.get(outcome)
        group = f' data-group="{c["group"]}"' if c["group"] is not None else ""
        lm, cap = c["local_memory_bytes"], c["local_memory_capacity"]
        local = f"{_f(lm / 1024 if lm is not None else None, '.1f')} / {_f(cap / 1024, '.1f')}"
        rows.append(
            f'<tr class="{cls or ""}" data-verdict="{e(c["verdict"])}" '
            f'data-outcome="{e(outcome)}"{group}><td class="n">{i}</td><td>{e(c["key"])}</td>'
            f'<td>{e(c["source"])}</td><td class="ops">{e(" + ".join(c["ops"]))}</td>'
            + _num_td(_pair(c["hbm_accesses"], "d"), c["hbm_accesses"][0])
            + _num_td(_pair(c["time_us"], ".2f"), c["time_us"][0])
            + _num_td(_pair(c["gflops"], ".1f"), c["gflops"][0])
            + _num_td(local, lm)
            + f'<td class="v-{e(c["verdict"])}">{e(c["verdict"])}</td><td>{e(c["outcome"])}</td>'
            f'<td class="why"><b>{e(c["code"])}</b>: {e(c["message"])}<br>nodes: '
            f"{e(_names(c['nodes']))}</td></tr>"
        )
    verdicts = sorted({c["verdict"] for c in d["candidates"]})
    outcomes = sorted({c["outcome"].split(":")[0] for c in d["candidates"]})
    return (
        '<section id="candidates"><h2>Candidates</h2><p class="muted">Every fusion candidate '
        "(rule matches and automatic clusters) with the cost model's numbers before \u2192 "
        "after fusing. Click a column to sort, a row with a group to show it on the graph."
        '</p><div class="filters"><input id="cand-filter" placeholder="filter: operator, '
        f'name, reason\u2026"><select id="cand-verdict">{_options(verdicts, "verdict")}</select>'
        f'<select id="cand-outcome">{_options(outcomes, "outcome")}</select>'
        '<span id="cand-count" class="muted"></span></div>'
        + _table(head, rows, ' id="cand-table"')
        + "</section>"
    )


def _names(names: list[str], limit: int = 12) -> str:
    more = f", \u2026 ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _options(values: list[str], what: str) -> str:
    return f'<option value="">every {what}</option>' + "".join(
        f'<option value="{e(v)}">{e(v)}</option>' for v in values
    )


def _stat_cells(st: dict[str, Any]) -> str:
    return (
        _num_td(_f(st.get("cosine"), ".9f"), st.get("cosine"))
        + _num_td(_f(st.get("max_abs"), ".3g"), st.get("max_abs"))
        + _num_td(_f(st.get("max_rel"), ".3g"), st.get("max_rel"))
    )


def _precision(d: dict[str, Any]) -> str:
    out = ['<section id="precision"><h2>Precision</h2>']
    stats = [("cosine", "num"), ("max abs error", "num"), ("max rel error", "num")]
    p = d["precision"]
    if p and p["outputs"]:
        rows = [f"<tr><td>%{e(k)}</td>{_stat_cells(v)}</tr>" for k, v in p["outputs"].items()]
        out.append("<h3>Model outputs, fused against the original</h3>")
        out.append(_table([("output", "text"), *stats], rows))
    fusions = [(i, g) for i, g in enumerate(d["groups"]) if g["safety"]]
    if fusions:
        rows = []
        for i, g in fusions:
            s = g["safety"]
            ok = "pass" if s["passed"] else "fail"
            rows.append(
                f'<tr data-group="{i}"><td>{e(g["key"])}</td>{_stat_cells(s)}'
                + _num_td(_f(s.get("mc_spread"), ".3g"), s.get("mc_spread"))
                + f'<td class="{ok}">{e(s["code"])}</td></tr>'
            )
        out.append("<h3>Per fusion (safe mode, on the real activations)</h3>")
        head = [("fusion", "text"), *stats, ("Monte-Carlo spread", "num"), ("verdict", "text")]
        out.append(_table(head, rows))
    if p and p["layers"]:
        rows = [
            f"<tr><td>{e(b['block'])}</td>"
            + _num_td(str(b["values"]), b["values"])
            + _num_td(_f(b["worst_cosine"], ".9f"), b["worst_cosine"])
            + _num_td(_f(b["max_abs"], ".3g"), b["max_abs"])
            + f"<td>%{e(b['worst_value'])}</td></tr>"
            for b in p["layers"]
        ]
        out.append("<h3>Per layer: intermediate values both models compute (by name)</h3>")
        head = [
            ("layer", "text"),
            ("values", "num"),
            ("worst cosine", "num"),
            ("max abs error", "num"),
            ("least similar value", "text"),
        ]
        out.append(_table(head, rows))
        rows = [
            f"<tr><td>%{e(v[0])}</td><td>{e(v[1])}</td>"
            + _stat_cells({"cosine": v[2], "max_abs": v[3], "max_rel": v[4]})
            + "</tr>"
            for v in p["values"]
        ]
        out.append(
            f"<details><summary>every compared value ({len(rows)})</summary>"
            '<div class="filters"><input id="value-filter" placeholder="filter values">'
            '<span id="value-count" class="muted"></span></div>'
            + _table([("value", "text"), ("layer", "text"), *stats], rows, ' id="value-table"')
            + "</details>"
        )
    if len(out) == 1:
        out.append("<p>No precision data: fuse in safe mode, or verify_precision().</p>")
    out.append("</section>")
    return "".join(out)


def _timing(d: dict[str, Any]) -> str:
    chart = timing_chart(d["timing"])
    measured = any(t["measured_us"][0] is not None for t in d["timing"])
    note = (
        ""
        if measured
        else '<p class="muted">Not measured in this run (safe mode\'s speed check off): '
        "the cost model's estimates only.</p>"
    )
    body = chart or "<p>No applied fusion.</p>"
    return (
        '<section id="timing"><h2>Estimated and measured time per fusion</h2><p class="muted">'
        f"Cost model on {e(str(d['profile']))} against safe mode's measurement of the "
        "unfused and fused operators on the real activations. Click a row to show the "
        f"fusion.</p>{note}{body}</section>"
    )


def _hardware(d: dict[str, Any]) -> str:
    hw = d["hardware"]
    rows = []
    for k, v in hw.items():
        if k in ("sources", "extra") and isinstance(v, dict):
            text = "; ".join(f"{a}: {b}" for a, b in v.items())
        elif isinstance(v, dict):
            text = ", ".join(f"{a} {b}" for a, b in v.items())
        else:
            text = str(v)
        rows.append(f"<tr><th>{e(k)}</th><td>{e(text)}</td></tr>")
    return (
        f'<section id="hardware"><h2>Hardware profile: {e(str(hw.get("name", "?")))}</h2>'
        f"<table>{''.join(rows)}</table></section>"
    )


def _footer() -> str:
    return (
        f"<footer><details><summary>Graph layout: @dagrejs/dagre {DAGRE_VERSION} (MIT), "
        f"inlined</summary><pre>{e(_static('dagre.LICENSE'))}</pre></details></footer>"
    )


def render_html_report(data: dict[str, Any]) -> str:
    """The page of ``data`` (:func:`~graph_autofusion.report.report_data.report_data`)."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(data['title'])}</title><style>{_static('report.css')}</style></head>"
        f'<body data-kind="{e(data["kind"])}">\n'
        + _header(data)
        + "<main>"
        + _summary(data)
        + _graph(data)
        + _candidates(data)
        + _precision(data)
        + _timing(data)
        + _hardware(data)
        + "</main>"
        + _footer()
        + f'\n<script type="application/json" id="gaf-data">{script_json(data)}</script>\n'
        + f"<script>/* @dagrejs/dagre {DAGRE_VERSION}, MIT license (see the page footer) */\n"
        + _static("dagre.min.js")
        + "</script>\n<script>"
        + _static("report.js")
        + "</script>\n</body></html>\n"
    )


def html_report(**kwargs: Any) -> str:
    """``render_html_report(report_data(**kwargs))``: the page of a fuse result or analysis."""
    return render_html_report(report_data(**kwargs))


def analysis_page(analysis: Any) -> str:
    """The page of an :class:`~graph_autofusion.planner.records.AnalysisReport`."""
    return html_report(analysis=analysis)


register_renderer("analysis-html", analysis_page)  # AnalysisReport.to_html

"""Renderings of an :class:`~graph_autofusion.planner.analysis.AnalysisReport` (F14).

* :func:`render_text`: a console table, one row per candidate (source, operators, HBM accesses
  before -> after, time before -> after, GFLOPS before -> after, local memory need / capacity,
  verdict, plan outcome) and, with ``reasons``, the reason sentence under it; then the totals.
* HTML: ``report.to_html()``, the self-contained report page of
  :mod:`graph_autofusion.report.html_report` (graph, candidate table, hardware profile).
* :func:`write_atomic`: write a rendering to a file through a temporary file and ``os.replace``.

JSON is ``report.to_dict()``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from graph_autofusion.errors import PathError
from graph_autofusion.files import temp_beside
from graph_autofusion.renderers import register_renderer

if TYPE_CHECKING:  # pragma: no cover
    from graph_autofusion.planner.analysis import AnalysisReport, CandidateAnalysis

__all__ = ["render_text", "write_atomic"]


def _short(s: str, width: int) -> str:
    return s if len(s) <= width else s[: width - 2] + ".."


def _ops(ops: list[str], width: int) -> str:
    names = [o.split("::")[-1] for o in ops]
    text = "+".join(names)
    if len(text) <= width:
        return text
    out = ""
    for i, n in enumerate(names):
        tail = f"+..({len(names) - i})"
        cand = (out + "+" + n) if out else n
        if len(cand) + len(tail) > width:
            return out + tail
        out = cand
    return out


def _num(x: float | None, fmt: str) -> str:
    return "?" if x is None else format(x, fmt)


def _arrow(a: float | int | None, b: float | int | None, fmt: str) -> str:
    return f"{_num(a, fmt)} -> {_num(b, fmt)}"


def _kib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024:.1f}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _us(s: float | None) -> float | None:
    return None if s is None else s * 1e6


def _row_cells(i: int, c: CandidateAnalysis) -> list[str]:
    fc = c.cost
    return [
        str(i),
        _short(c.source, 30),
        _ops(fc.ops, 34),
        _arrow(fc.hbm_accesses_before, fc.hbm_accesses_after, "d"),
        _arrow(_us(fc.time_before_s), _us(fc.time_after_s), ".2f"),
        _arrow(fc.gflops_before, fc.gflops_after, ".1f"),
        f"{_kib(fc.local_memory_bytes)}/{_kib(fc.local_memory_capacity)}",
        fc.verdict.value,
        _outcome(c),
    ]


def _outcome(c: CandidateAnalysis) -> str:
    """``CHOSEN``, the planner's code, or ``-`` when the verdict column already says why."""
    if c.chosen:
        return "CHOSEN"
    return "-" if c.code == c.cost.verdict.value else c.code


HEADERS = [
    "#",
    "source",
    "operators",
    "HBM acc",
    "time us",
    "GFLOPS",
    "local KiB",
    "verdict",
    "plan",
]


def render_text(report: AnalysisReport, *, reasons: bool = True) -> str:
    """Console table of every candidate, then the totals."""
    r = report
    sym = ", ".join(f"{k}={v}" for k, v in sorted(r.symbols.items())) or "static"
    lines = [
        f"Fusion benefit analysis: {r.model_name} ({r.num_nodes} nodes) on {r.profile} "
        f"({r.profile_kind})",
        f"shapes: {r.binding_method} ({sym}); strategy {r.strategy} -> {r.strategy_used}; "
        f"benefit threshold {r.benefit_threshold:.0%}",
    ]
    lines.extend(f"note: {n}" for n in r.plan.notes)
    rows = [HEADERS] + [_row_cells(i, c) for i, c in enumerate(r.candidates, 1)]
    widths = [max(len(row[k]) for row in rows) for k in range(len(HEADERS))]
    right = {0, 3, 4, 5, 6}

    def fmt(row: list[str]) -> str:
        cells = [
            cell.rjust(widths[k]) if k in right else cell.ljust(widths[k])
            for k, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    lines.append(fmt(HEADERS))
    lines.append("  ".join("-" * w for w in widths))
    pad = " " * (widths[0] + 2)
    for row, c in zip(rows[1:], r.candidates, strict=True):
        lines.append(fmt(row))
        if reasons:
            lines.append(f"{pad}{c.key}: {c.message}")
    lines.append("")
    lines.extend(_totals_lines(r))
    if r.target:
        lines.append(f"plan for the {r.target} target: what fuse() carries out")
    for name, other in (r.other_targets or {}).items():
        lines.append(
            f"the {name} target would fuse {other['fusions']} groups instead "
            f"(estimated {100 * other['performance_improvement']:+.1f}%; "
            f"GraphAutoFusion(..., target={name!r}))"
        )
    return "\n".join(lines)


def _totals_lines(r: AnalysisReport) -> list[str]:
    verdicts = ", ".join(f"{k} {v}" for k, v in r.verdict_counts().items())
    codes = ", ".join(f"{k} {v}" for k, v in r.code_counts().items())
    out = [
        f"candidates: {len(r.candidates)} ({verdicts}); chosen {len(r.chosen)}",
        f"outcomes: {codes or 'none'}",
        f"estimated time: {r.time_before_s * 1e6:.2f} us -> {r.time_after_s * 1e6:.2f} us "
        f"(performance_improvement {r.performance_improvement:+.1%}, "
        f"{r.time_saving_fraction:.1%} of the time removed)",
        f"HBM accesses: {r.hbm_accesses_before} -> {r.hbm_accesses_after} "
        f"(hbm_access_reduction {r.hbm_access_reduction:.1%}); bytes {_size(r.bytes_before)} "
        f"-> {_size(r.bytes_after)}",
    ]
    if r.unknown_nodes:
        out.append(f"{r.unknown_nodes} node(s) of unknown cost are left out of the totals")
    return out


register_renderer("analysis-text", render_text)  # AnalysisReport.to_text


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``:
    readers never see a partial file, and on failure the old content stays."""

    dest = Path(path)
    if dest.exists() and not dest.is_file():  # a directory, a device (/dev/full), a pipe
        raise PathError(f"{dest}: cannot write the report there: not a regular file")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = temp_beside(dest, prefix=f".{dest.name}.", suffix=".tmp")
    except OSError as e:  # read-only or missing folder: nothing was written
        raise PathError(f"{dest}: cannot write the report: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except OSError as e:  # a full disk: the temporary file goes, the old content stays
        Path(tmp).unlink(missing_ok=True)
        raise PathError(
            f"{dest}: cannot write the report: {e.strerror or e}; nothing was written"
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest

"""Everything the HTML report shows, as one JSON-able dict (F14).

    data = report_data(result=gaf.result, precision=gaf.verify_precision(), hardware=profile)
    data = report_data(analysis=gaf.analyze())          # before fusing: the plan only

The page (:mod:`graph_autofusion.report.html_report`) renders its tables from this dict and
embeds it whole for its script, which draws the graphs. Keys:

* ``title``, ``model``, ``target``, ``safe_mode``, ``strategy``, ``profile``, ``kind``
  (``fuse`` after a fuse run, ``analysis`` for a plan only);
* ``summary``: candidates, planned, fused, rolled back, skipped by reason, estimated and
  measured improvement, HBM access reduction, whole-model estimated times, end to end;
* ``groups``: one per fusion drawn on the graph (``applied``, ``rolled-back``,
  ``not-lowered``; ``planned`` in an analysis): rule, operators, the nodes it replaced and the
  nodes that compute it now, the cost model's estimate, safe mode's checks, its precision;
* ``candidates``: every candidate's costs, verdict and outcome, with its group's index;
* ``precision``: per output, per layer (the blocks of the graph view) and per value;
* ``timing``: estimated and measured time of each applied fusion;
* ``hardware``: the profile's fields; ``graphs``: ``before`` and ``after``
  (:func:`~graph_autofusion.report.graph_view.graph_view`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.report.graph_view import block_of, graph_view

__all__ = ["report_data"]

#: The fields of a safe-mode result (``verify.safety.SafetyResult``) the reports show.
SAFETY_KEYS = (
    "passed",
    "code",
    "cosine",
    "max_abs",
    "max_rel",
    "mc_spread",
    "fp16_max",
    "time_unfused_us",
    "time_fused_us",
)


_SAFETY_FIELDS = ("message", *SAFETY_KEYS)


def _finite(x: Any) -> Any:
    """JSON has no inf/nan: they become strings the page shows as they are."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, Mapping):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return _finite(x.item())  # numpy scalars
    return x


def _safety(res: Any) -> dict[str, Any] | None:
    if res is None:
        return None
    out = {k: getattr(res, k, None) for k in _SAFETY_FIELDS}
    details = getattr(res, "details", None) or {}
    if isinstance(details.get("outputs"), Mapping):
        out["outputs"] = dict(details["outputs"])
    return out


def _estimate(c: Any) -> dict[str, Any]:
    d = c.to_dict()
    keep = ("hbm_accesses", "bytes", "time_us", "gflops", "local_memory_bytes")
    out = {k: d[k] for k in keep}
    out.update(
        local_memory_capacity=d["local_memory_capacity"],
        saving=d["saving"],
        saving_us=d["saving_us"],
        verdict=d["verdict"],
        reason=c.cost.reason,
        benefit_threshold=d["benefit_threshold"],
    )
    return out


def _group(key, rule, status, code, message, ops, nodes, new_nodes, cand, safety) -> dict:
    return {
        "key": key,
        "rule": rule,
        "status": status,
        "code": code,
        "message": message,
        "fused_ops": list(ops),
        "nodes": list(nodes),
        "new_nodes": list(new_nodes),
        "candidate": cand,
        "safety": safety,
    }


def _groups(analysis: Any, result: Any) -> list[dict[str, Any]]:
    cands = {c.key: i for i, c in enumerate(analysis.candidates)} if analysis else {}
    by_key = {c.key: c for c in analysis.candidates} if analysis else {}
    out: list[dict[str, Any]] = []
    if result is None:
        for i, c in enumerate(analysis.candidates):
            if c.chosen:
                out.append(
                    _group(
                        c.key,
                        c.source,
                        "planned",
                        c.code,
                        c.message,
                        [c.fused_op],
                        c.cost.nodes,
                        [],
                        i,
                        None,
                    )
                )
        return out
    after = {n.name for n in result.model.graph.nodes}
    for low in result.lowered:
        new = [n.name for n in low.new_nodes if n.name in after]
        out.append(
            _group(
                low.key,
                low.rule,
                "applied",
                "ok",
                "fused and verified" if result.safe_mode else "fused (safe mode off: not verified)",
                low.fused_ops,
                low.original_node_names,
                new,
                cands.get(low.key),
                _safety(result.safety.get(low.key)),
            )
        )
    for b in result.rolled_back:
        c = by_key.get(b.key)
        out.append(
            _group(
                b.key,
                b.rule,
                "rolled-back",
                b.code,
                b.message,
                [c.fused_op] if c else [],
                c.cost.nodes if c else [],
                [],
                cands.get(b.key),
                _safety(b.result),
            )
        )
    for n in result.not_lowered:
        c = by_key.get(n.key)
        if c is not None and c.chosen:
            out.append(
                _group(
                    n.key,
                    n.rule,
                    "not-lowered",
                    n.code,
                    n.message,
                    [c.fused_op],
                    c.cost.nodes,
                    [],
                    cands[n.key],
                    None,
                )
            )
    return out


def _outcome(c: Any, group: dict[str, Any] | None) -> str:
    if group is None:
        return c.code
    status = group["status"]
    if status == "applied":
        return "fused"
    if status == "planned":
        return "planned"
    return f"{status}: {group['code']}"


def _node_groups(groups: list[dict[str, Any]], field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, g in enumerate(groups):
        for name in g[field]:
            out.setdefault(name, i)
    return out


def _precision(precision: Mapping[str, Any] | None, result: Any, original: Any) -> Any:
    outputs: dict[str, Any] = {}
    if precision and isinstance(precision.get("outputs"), Mapping):
        outputs = dict(precision["outputs"])
    elif result is not None and result.end_to_end:
        e2e = result.end_to_end.get("outputs", result.end_to_end)
        outputs = {k: dict(v) for k, v in e2e.items() if isinstance(v, Mapping)}
    layers = (precision or {}).get("layers")
    if not outputs and not layers:
        return None
    values: list[list[Any]] = []
    per_block: dict[str, dict[str, Any]] = {}
    if isinstance(layers, Mapping) and original is not None:
        producer = {v.name: n for n in original.graph.nodes for v in n.outputs}
        for name, st in layers.items():
            node = producer.get(name)
            block = (block_of(node) if node is not None else None) or "(top level)"
            values.append([name, block, st.get("cosine"), st.get("max_abs"), st.get("max_rel")])
            agg = per_block.setdefault(
                block,
                {
                    "block": block,
                    "values": 0,
                    "worst_cosine": 1.0,
                    "max_abs": 0.0,
                    "worst_value": name,
                },
            )
            agg["values"] += 1
            cos, mab = st.get("cosine", 1.0), st.get("max_abs", 0.0)
            if cos < agg["worst_cosine"]:
                agg["worst_cosine"], agg["worst_value"] = cos, name
            agg["max_abs"] = max(agg["max_abs"], mab)
        values.sort(key=lambda r: (r[2] if r[2] is not None else 1.0, r[0]))
    return {"outputs": outputs, "layers": list(per_block.values()), "values": values}


def _timing(groups: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> list[dict]:
    out = []
    for i, g in enumerate(groups):
        if g["status"] != "applied" or g["candidate"] is None:
            continue
        est = candidates[g["candidate"]]["time_us"]
        s = g["safety"] or {}
        out.append(
            {
                "group": i,
                "key": g["key"],
                "estimated_us": est,
                "measured_us": [s.get("time_unfused_us"), s.get("time_fused_us")],
            }
        )
    return out


def _hardware(hardware: Any, analysis: Any) -> dict[str, Any]:
    prof = hardware if hardware is not None else getattr(analysis, "hardware", None)
    if prof is not None and not hasattr(prof, "to_dict"):
        prof = load_profile(prof)
    if prof is None:
        return {"name": getattr(analysis, "profile", "?")}
    return prof.to_dict()


def _summary(analysis: Any, result: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if analysis is not None:
        t = analysis.totals()
        out.update(
            candidates=t["candidates"],
            planned=t["chosen"],
            estimated_improvement=t["performance_improvement"],
            hbm_access_reduction=t["hbm_access_reduction"],
            hbm_accesses=t["hbm_accesses"],
            time_us=[t["time_before_us"], t["time_after_us"]],
            by_code=t["by_code"],
        )
    if result is not None:
        s = result.summary()
        out.update(
            fused=s["fused"],
            rolled_back=s["rolled_back"],
            fused_ops=s["fused_ops"],
            skipped=s["skipped"],
            measured_improvement=s["measured_improvement"],
            end_to_end=s["end_to_end"],
            safe_mode=s["safe_mode"],
        )
    return out


def report_data(
    *,
    analysis: Any = None,
    result: Any = None,
    precision: Mapping[str, Any] | None = None,
    hardware: Any = None,
    model_name: str = "",
) -> dict[str, Any]:
    """The report's data (see the module docstring) from a fuse ``result`` (a
    :class:`~graph_autofusion.pipeline.FuseResult`, whose analysis is used) or an
    ``analysis`` alone; ``precision`` is :meth:`GraphAutoFusion.verify_precision`'s dict."""
    if result is not None and analysis is None:
        analysis = result.analysis
    if analysis is None:
        raise ValueError("report_data needs an analysis or a fuse result")
    groups = _groups(analysis, result)
    by_cand = {g["candidate"]: i for i, g in enumerate(groups) if g["candidate"] is not None}
    candidates = []
    for i, c in enumerate(analysis.candidates):
        d = c.to_dict()
        gi = by_cand.get(i)
        d["group"] = gi
        d["outcome"] = _outcome(c, groups[gi] if gi is not None else None)
        d["reason"] = c.cost.reason
        candidates.append(d)
    before = result.original if result is not None else getattr(analysis, "model", None)
    graphs: dict[str, Any] = {"before": None, "after": None}
    if before is not None:
        graphs["before"] = graph_view(before.graph, _node_groups(groups, "nodes"))
    if result is not None:
        origin = {n.name: n for n in before.graph.nodes} if before is not None else {}
        inherited = {}
        for g in groups:  # a fused operator sits in the block of the nodes it replaced
            blocks = [block_of(origin[n]) for n in g["nodes"] if n in origin]
            blocks = [b for b in blocks if b]
            if blocks:
                inherited.update({n: max(set(blocks), key=blocks.count) for n in g["new_nodes"]})
        graphs["after"] = graph_view(
            result.model.graph, _node_groups(groups, "new_nodes"), inherited_blocks=inherited
        )
    name = model_name or analysis.model_name
    data = {
        "version": 1,
        "kind": "fuse" if result is not None else "analysis",
        "title": f"Graph AutoFusion report: {name}",
        "model": name,
        "target": getattr(result, "target", None) or analysis.target or "onnxruntime",
        "safe_mode": result.safe_mode if result is not None else None,
        "strategy": f"{analysis.strategy} -> {analysis.strategy_used}",
        "benefit_threshold": analysis.benefit_threshold,
        "profile": analysis.profile,
        "shapes": {"method": analysis.binding_method, "symbols": dict(analysis.symbols)},
        "summary": _summary(analysis, result),
        "notes": list(analysis.plan.notes) + (list(result.notes) if result is not None else []),
        "groups": groups,
        "candidates": candidates,
        "precision": _precision(precision, result, before),
        "timing": _timing(groups, candidates),
        "hardware": _hardware(hardware, analysis),
        "graphs": graphs,
    }
    return _finite(data)

"""Reason codes live in one module (issue 14): every code the code base emits is defined in
graph_autofusion.reasons with its stage and one-sentence meaning, and no module writes a code
as a string literal."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import graph_autofusion
from graph_autofusion import reasons
from graph_autofusion.reasons import CODES, STAGES

PACKAGE = Path(graph_autofusion.__file__).parent

#: constructors and helpers that take a reason code, and the position of the code argument
CODE_ARGS = {
    "RolledBack": 2,
    "NotLowered": 2,
    "SafetyResult": 2,
    "Rejected": 1,
    "Rejection": 0,
    "KernelRefused": 0,
    "PairVerdict": 3,
    "MergeRejection": 4,
}
#: ``fail(code, message)`` in safe mode (elsewhere ``fail`` takes a message)
FAIL_TAKES_A_CODE = ("verify/safety.py",)


def test_every_code_has_a_stage_and_a_sentence():
    assert len(CODES) >= 60
    for code, rc in CODES.items():
        assert rc.code == code and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", code), code
        assert rc.stages and set(rc.stages) <= set(STAGES), code
        assert rc.meaning[:1].isupper() and rc.meaning.endswith("."), (code, rc.meaning)
        assert rc.meaning.count(". ") == 0, (code, "one sentence")
    grouped = reasons.by_stage()
    assert all(grouped[s] for s in STAGES)  # no empty stage
    assert reasons.meaning("numerics").startswith("A fused output's cosine")
    with pytest.raises(KeyError):
        reasons.meaning("no-such-code")


def _stage_classes():
    from graph_autofusion.codegen.lower import KernelReason
    from graph_autofusion.codegen.onnxruntime import LowerReason
    from graph_autofusion.codegen.ort_customop import CustomOpReason
    from graph_autofusion.patterns.matcher import Reason
    from graph_autofusion.patterns.pairs import PairReason
    from graph_autofusion.planner.plan import PlanReason

    return [Reason, PairReason, PlanReason, LowerReason, KernelReason, CustomOpReason]


def test_the_stage_classes_are_views_of_the_module():
    from graph_autofusion.cost.model import Verdict
    from graph_autofusion.pipeline.progressive import NOT_A_FAILURE
    from graph_autofusion.planner import analysis, controls

    seen = []
    for cls in _stage_classes():
        for name, value in vars(cls).items():
            if name.isupper():
                assert value in CODES, f"{cls.__name__}.{name} = {value!r}"
                seen.append(value)
    assert len(seen) >= 50
    assert {v.value for v in Verdict} <= set(CODES)
    for value in (analysis.CHOSEN, analysis.SAME_AS_RULE, *NOT_A_FAILURE):
        assert value in CODES
    assert {controls.PRECISION_CONSTRAINT, controls.SIZE_SWITCH_OFF} <= set(CODES)


def _literal_codes(tree: ast.AST, fail_takes_a_code: bool = True):
    """``(line, text)`` of each string literal written where a reason code goes."""

    def lit(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
            return node.value
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "code" and lit(kw.value):
                    yield node.lineno, lit(kw.value)
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            pos = CODE_ARGS.get(name, 0 if name == "fail" and fail_takes_a_code else None)
            if pos is not None and len(node.args) > pos and lit(node.args[pos]):
                yield node.lineno, lit(node.args[pos])
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for t, v in pairs:
                    named = t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "")
                    if named == "code" and lit(v):
                        yield node.lineno, lit(v)
        elif isinstance(node, ast.Compare):
            left = node.left
            named = left.attr if isinstance(left, ast.Attribute) else getattr(left, "id", "")
            if named == "code":
                for comp in node.comparators:
                    values = (
                        comp.elts if isinstance(comp, ast.Tuple | ast.Set | ast.List) else [comp]
                    )
                    for v in values:
                        if lit(v):
                            yield node.lineno, lit(v)


def test_no_module_writes_a_code_as_a_string_literal():
    files = [p for p in PACKAGE.rglob("*.py") if p.name != "reasons.py"]
    assert len(files) > 100
    found = []
    for path in files:
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, text in _literal_codes(tree, rel in FAIL_TAKES_A_CODE):
            found.append(f"{rel}:{line}: {text!r}")
    assert found == []  # import the constant from graph_autofusion.reasons


def test_the_scan_finds_literals():
    """The scanner above sees each way code is written (a guard against a scan that finds
    nothing because it looks in the wrong place)."""
    src = (
        "RolledBack(k, r, 'numerics', m)\nKernelRefused('x-y', m)\nres.passed, res.code = "
        "False, 'slower'\nf(code='ok')\nif b.code == 'stale': pass\nfail('alias', m)\n"
    )
    assert [t for _, t in sorted(_literal_codes(ast.parse(src)))] == [
        "numerics",
        "x-y",
        "slower",
        "ok",
        "stale",
        "alias",
    ]


def test_codes_a_real_run_emits_are_all_defined(tmp_path):
    """Fuse and analyze a tiny model (onnxruntime target, safe mode; cpu target plan) and
    check every code in the results, reports and summaries."""
    from graph_autofusion.api import GraphAutoFusion
    from tests.tiny_models import PROFILE, write_model

    model = write_model(tmp_path / "m.onnx")
    emitted: set[str] = set()
    gaf = GraphAutoFusion(model, hardware=PROFILE)
    cand = gaf.candidates().to_dict()
    emitted |= {r["closest"]["code"] for r in cand["rules"] if "closest" in r}
    emitted |= set(cand.get("cluster_rejections", {}))
    emitted |= set(cand.get("pairs", {}).get("by_reason", {}))
    result = gaf.fuse(check_speed=False)
    res = gaf.result
    emitted |= {n.code for n in res.not_lowered} | {b.code for b in res.rolled_back}
    emitted |= {k.removeprefix("rolled-back:") for k in res.skipped_by_reason()}
    emitted |= {c.code for c in res.analysis.candidates if c.code}
    emitted |= {c.cost.verdict.value for c in res.analysis.candidates}
    assert result is not None
    cpu = GraphAutoFusion(model, hardware=PROFILE, target="cpu")
    report = cpu.analyze()
    emitted |= set(report.code_counts()) | {c.cost.verdict.value for c in report.candidates}
    assert emitted - set(CODES) == set()
    assert {"no-native-form", "chosen"} & emitted  # the run did report some codes


def test_docs_list_every_code():
    """docs/reasons.md lists every code of the module (the page users read)."""
    page = (Path(__file__).parent.parent / "docs" / "reasons.md").read_text()
    missing = [c for c in reasons.CODES if f"`{c}`" not in page]
    assert not missing, f"docs/reasons.md does not list {missing}"

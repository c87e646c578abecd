"""Test harness for fusion rules: match, rewrite, check the nodes and the numbers.

    from graph_autofusion.testing.rules import check_rule, check_no_match

    model = check_rule(RULE, TEXT, matches=1, ops_after=["Gelu"], native=True)
    check_no_match(RULE, NEGATIVE_TEXT, reason="value-mismatch")

Graphs are written in the IR's text form (:mod:`graph_autofusion.ir.text`) with static shapes;
inputs are seeded random arrays. ``check_rule`` rewrites with the rule's native lowering when
``native=True`` (the rule must have one) and with the generic local-function form otherwise,
verifies the graph, and compares the reference interpreter's outputs before and after.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from graph_autofusion.frontend.onnx_frontend import load_onnx
from graph_autofusion.frontend.torch_frontend import from_torch
from graph_autofusion.ir.core import Graph, Model
from graph_autofusion.ir.text import parse_model
from graph_autofusion.ir.verify import verify
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rewrite import FUSED_DOMAIN
from graph_autofusion.patterns.rules import FusionRule, RuleSet
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing import build_model, example_feeds, export_onnx


def random_feeds(graph: Graph, seed: int = 0, *, int_high: int = 8) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input (normal floats, ints in ``[0, int_high)``)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        if v.name in graph.initializers:
            continue
        if not v.is_static or v.dtype is None:
            raise ValueError(f"input %{v.name} needs a static shape and dtype in a rule test")
        np_dtype = v.dtype.to_numpy()
        if np.issubdtype(np_dtype, np.floating):
            feeds[v.name] = rng.standard_normal(v.shape).astype(np_dtype)
        elif np_dtype == np.bool_:
            feeds[v.name] = rng.random(v.shape) < 0.5
        else:
            feeds[v.name] = rng.integers(0, int_high, v.shape).astype(np_dtype)
    return feeds


def fused_ops(model: Model) -> list[str]:
    """The graph's operators in order; generic fused calls print as their function name."""
    out = []
    for n in model.graph.nodes:
        out.append(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
    return out


def check_rule(
    rule: FusionRule,
    text: str,
    *,
    matches: int,
    ops_after: Sequence[str] | None = None,
    native: bool = False,
    seed: int = 0,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> Model:
    """Assert that ``rule`` matches ``matches`` times in ``text``, rewrite, and compare numbers.

    Args:
        ops_after: Expected operator list after the rewrite (as :func:`fused_ops` prints it).
            Default for the generic form: every match became ``graph_autofusion.fused::NAME``.
        native: Use the rule's native rewrite (it must have one) instead of the generic form.
    """
    model = parse_model(text)
    original = parse_model(text)
    report = match_rules(model.graph, RuleSet((rule,)))
    found = report.per_rule[rule.name]
    assert found.kept == matches, (
        f"{rule.name}: {found.kept} matches, want {matches}; closest failure: {found.closest}"
    )
    if native:
        assert rule.rewrite is not None, f"{rule.name} has no native rewrite"
    applied = apply_matches(model, report.kept, native=native)
    errors = [a.error for a in applied if a.error]
    assert not errors, errors
    verify(model)
    ops = fused_ops(model)
    if ops_after is not None:
        assert ops == list(ops_after), f"{rule.name}: ops after rewrite {ops}, want {ops_after}"
    elif not native:
        fused = [o for o in ops if o.startswith(FUSED_DOMAIN)]
        assert len(fused) == matches, ops
    feeds = random_feeds(original.graph, seed)
    before = run_model(original, feeds)
    after = run_model(model, feeds)
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_allclose(
            after[name], before[name], rtol=rtol, atol=atol, err_msg=f"{rule.name}: %{name}"
        )
    return model


def check_no_match(rule: FusionRule, text: str, *, reason: str | None = None) -> None:
    """Assert that ``rule`` does not match ``text``; with ``reason``, that the closest partial
    match failed with that reason code."""
    model = parse_model(text)
    report = match_rules(model.graph, RuleSet((rule,)))
    found = report.per_rule[rule.name]
    assert found.kept == 0, f"{rule.name} matched {[m.match.root.name for m in report.kept]}"
    if reason is not None:
        closest = found.closest
        assert closest is not None and closest.code == reason, (
            f"{rule.name}: closest failure {closest}, want reason {reason!r}"
        )


#: Where a zoo graph comes from: an ONNX exporter, or the PyTorch frontend (``torch``).
SOURCES = ("dynamo", "torchscript", "torch")


@functools.cache
def zoo_model(name: str, source: str) -> Model:
    """A zoo model as IR, cached per process (do not mutate it; use :func:`zoo_copy`).

    ``source`` is an exporter (the cached ONNX file is loaded) or ``torch`` (``from_torch``).
    """
    if source == "torch":
        module, inputs = build_model(name)
        return from_torch(module, (), dict(inputs))

    return load_onnx(export_onnx(name, source))


def zoo_matches(rule: FusionRule, name: str, source: str) -> int:
    """How many times ``rule`` matches (before overlap resolution with other rules)."""
    model = zoo_model(name, source)
    report = match_rules(model.graph, RuleSet((rule,)))
    return report.per_rule[rule.name].kept


def zoo_native_rewrite(
    name: str, source: str, rule_names: Sequence[str], *, rtol: float = 1e-4
) -> dict[str, int]:
    """Rewrite a zoo ONNX export with ``rule_names`` (native forms), check that onnxruntime
    gives the original's outputs, and return the rewritten graph's operator histogram."""

    original = load_onnx(export_onnx(name, source))
    model = load_onnx(export_onnx(name, source))
    rules = builtin_rules()
    report = match_rules(model.graph, RuleSet(tuple(rules.get(n) for n in rule_names)))
    applied = apply_matches(model, report.kept, native=True)
    errors = [a.error for a in applied if a.error]
    assert not errors, errors
    verify(model)
    feeds = example_feeds(name)  # resnet50_bn takes resnet50's inputs
    outs = []
    for m in (original, model):
        session = ort_session(m, "disable", 0, spinning=True)  # onnxruntime's threads
        wanted = {i.name for i in session.get_inputs()}
        outs.append(session.run(None, {k: v for k, v in feeds.items() if k in wanted}))
    for after, before in zip(outs[1], outs[0]):
        np.testing.assert_allclose(after, before, rtol=rtol, atol=rtol * np.abs(before).max())
    return model.graph.op_histogram()


def native_runs_in_onnxruntime(
    rule: FusionRule, text: str, *, expect_op: str, rtol: float = 1e-4, atol: float = 1e-4
) -> None:
    """Rewrite ``text`` with ``rule``'s native form, check that ``expect_op`` appears, and that
    onnxruntime (contrib-operator conventions) computes what the reference interpreter computes
    on the original graph."""

    model = parse_model(text)
    feeds = random_feeds(model.graph, 0)
    expected = run_model(parse_model(text), feeds)
    apply_matches(model, match_rules(model.graph, RuleSet((rule,))).kept, native=True)
    assert any(n.op_type == expect_op for n in model.graph.nodes), fused_ops(model)
    session = ort_session(model, "disable", 0, spinning=True)  # onnxruntime's threads
    for got, value in zip(session.run(None, feeds), model.graph.outputs):
        np.testing.assert_allclose(got, expected[value.name], rtol=rtol, atol=atol)

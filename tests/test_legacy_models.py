"""Issue 13's acceptance: a legacy opset-9 ResNet-50 fuses like a fresh export.

The file (:func:`graph_autofusion.testing.legacy.legacy_resnet50_bn`) is a real export of the
zoo's ``resnet50_bn`` rewritten into old spellings: BatchNorm statistics from
``ConstantOfShape``, Conv weights in ``Constant`` nodes, initializers listed as IR-3 graph
inputs, residual ``Sum`` nodes, ``Flatten`` as a Shape/Gather/Unsqueeze/Concat/Reshape program.
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import onnx
import pytest

from graph_autofusion import GraphAutoFusion
from graph_autofusion.frontend import load_model
from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing import example_feeds, export_onnx, ort_outputs
from graph_autofusion.testing.legacy import legacy_resnet50_bn
from graph_autofusion.verify.compare import compare_tensors

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("models")]

RULES = ("conv_bn", "conv_bn_relu", "add_relu")
PROFILE = "x86_avx2"  # a fixed profile: the plan does not depend on this machine


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _counts(graph) -> dict[str, int]:
    rules = builtin_rules()
    return {r: match_rules(graph, RuleSet((rules.get(r),))).per_rule[r].kept for r in RULES}


def _fuse(path):
    feeds = example_feeds("resnet50_bn")
    gaf = GraphAutoFusion(path, preset="all", hardware=PROFILE, sample_inputs=feeds)
    gaf.fuse(check_speed=False)
    return gaf, feeds


def test_legacy_resnet50_candidates_are_those_of_a_fresh_export():
    path = legacy_resnet50_bn()
    digest = _digest(path)
    proto = onnx.load(str(path))
    file_ops = collections.Counter(n.op_type for n in proto.graph.node)
    assert proto.ir_version == 3 and file_ops["ConstantOfShape"] > 0 and file_ops["Sum"] > 0

    before = _counts(load_onnx(path).graph)  # the exact import: no normalisation
    model = load_model(path)
    after = _counts(model.graph)
    fresh = _counts(load_onnx(export_onnx("resnet50_bn", "torchscript")).graph)
    assert before == dict.fromkeys(RULES, 0)
    assert after == fresh and all(after.values()), (after, fresh)

    rep = model.meta["legacy_normalization"]
    assert rep.constant_of_shape_folded == file_ops["ConstantOfShape"]
    assert rep.sums_to_adds == file_ops["Sum"]
    assert rep.listed_initializers_constant == len(proto.graph.initializer)
    assert rep.ir_version == (3, 4) and rep.skipped == []
    assert _digest(path) == digest  # the user's file is never modified


def test_legacy_resnet50_fuses_like_a_fresh_export_and_matches_onnxruntime():
    path = legacy_resnet50_bn()
    digest = _digest(path)
    gaf, feeds = _fuse(path)
    res = gaf.result
    fused = to_onnx(res.model)
    onnx.checker.check_model(fused, full_check=True)
    want = ort_outputs(path, feeds, threads=2)  # onnxruntime on the legacy file itself
    sess = ort_session(res.model, level="all")  # registers generated custom operators, if any
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    stats = {k: compare_tensors(got[k], v) for k, v in want.items()}
    assert min(s["cosine"] for s in stats.values()) >= 0.9999, stats
    assert all(np.isfinite(s["max_abs"]) for s in stats.values())

    lowered = collections.Counter(low.rule for low in res.lowered)
    assert lowered["conv_bn_relu"] > 0 and not res.rolled_back, res.rolled_back
    assert any(n.op_type == "FusedConv" for n in fused.graph.node)
    fresh, _ = _fuse(export_onnx("resnet50_bn", "torchscript"))
    assert lowered == collections.Counter(low.rule for low in fresh.result.lowered)
    # the replaced Constant weights do not linger: the fused file holds one copy of each
    assert not [n for n in fused.graph.node if n.op_type in ("Constant", "ConstantOfShape")]
    assert _digest(path) == digest

"""The fuse pipeline on architectures no issue names, from both torch exporters.

The small random-weight Hugging Face models of :mod:`graph_autofusion.testing.small_hf`
(decoder LLMs with grouped- or multi-query attention, partial rotary or GELU MLPs, encoders, an
encoder-decoder, a speech encoder, CNNs and a windowed-attention vision model), each exported
with ``torch.onnx.export(dynamo=True)`` and ``dynamo=False`` (opset 18) and fused with
``GraphAutoFusion(..., preset="all").fuse()`` (safe mode on, speed check off, the fixed
``x86_avx2`` profile so the plan does not depend on this machine's calibration).

The fused model must pass onnx.checker, its onnxruntime outputs must match the original
export's and PyTorch's, the graph must not grow, nothing may fail on the way (no rewrite error,
rollback or note), something must be fused, and each architecture must get the onnxruntime
native operators its plan has.

Each export also runs through the cpu target (generated kernels): every planned group fused
with no rollback, the plan ``analyze()`` shows equal to what ``fuse()`` did, one fused node
per kernel, outputs equal to the export's (cosine) and PyTorch's.

The two exports torch 2.13's dynamo exporter cannot produce (T5's and Swin's encoders,
``KNOWN_EXPORT_FAILURES``) are skipped with the exporter's error; any other export failure, or
a failure in our pipeline, fails.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")  # the dynamo exporter

from graph_autofusion import GraphAutoFusion  # noqa: E402
from graph_autofusion.codegen.onnxruntime import LowerReason  # noqa: E402
from graph_autofusion.frontend.onnx_frontend import to_onnx  # noqa: E402
from graph_autofusion.testing import ort_outputs  # noqa: E402
from graph_autofusion.testing.small_hf import (  # noqa: E402
    SMALL_HF,
    KnownExportFailure,
    export_small_hf,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("unseen")]

MS = "com.microsoft"
SLN, SSLN = f"{MS}::SkipLayerNormalization", f"{MS}::SkipSimplifiedLayerNormalization"

#: fused operators each export must get on x86_avx2 (at least one of each; the plan of
#: 2026-11-29, the same for both exporters)
EXPECTED_OPS: dict[str, set[str]] = {
    "qwen2": {SSLN, f"{MS}::QuickGelu"},
    "gemma": {SSLN},
    "phi": {SLN, f"{MS}::FastGelu"},
    "gpt_neox": {SLN, f"{MS}::BiasGelu"},
    "distilbert": {SLN, f"{MS}::BiasGelu"},
    "deberta_v2": {SLN, f"{MS}::BiasGelu"},
    "t5_encoder": {SSLN},
    "bart": {SLN, f"{MS}::BiasGelu"},
    "whisper_encoder": {SLN, f"{MS}::BiasGelu"},
    "vit": {SLN, f"{MS}::BiasGelu"},
    "convnext": {f"{MS}::BiasGelu"},
    "mobilenet_v2": {f"{MS}::FusedConv"},
    "swin": {SLN, f"{MS}::BiasGelu"},
}


def test_every_small_model_has_expectations():
    assert set(EXPECTED_OPS) == set(SMALL_HF)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("name", sorted(SMALL_HF))
def test_unseen_architecture_fuses_correctly(name, exporter, tmp_path):
    path = str(tmp_path / f"{name}-{exporter}.onnx")
    try:
        feeds, expected = export_small_hf(name, exporter, path)
    except KnownExportFailure as e:
        pytest.skip(str(e))
    original = onnx.load(path)
    # an output that is all ~0 would compare equal whatever the fusions did
    assert np.abs(expected).max() > 1e-2
    gaf = GraphAutoFusion(path, preset="all", hardware="x86_avx2", sample_inputs=feeds)
    fused = gaf.fuse(check_speed=False)
    result = gaf.result
    proto = to_onnx(fused)
    onnx.checker.check_model(proto)
    assert len(proto.graph.node) <= len(original.graph.node)
    before = ort_outputs(original, feeds)
    after = ort_outputs(proto, feeds)
    assert set(after) == set(before)
    for out_name, want in before.items():
        np.testing.assert_allclose(after[out_name], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(after["out"], expected, rtol=1e-3, atol=1e-4)
    # nothing failed on the way: no rewrite error, no rollback (the speed check is off, so a
    # rollback would be a numerics or end-to-end failure), no note; something was fused, and
    # everything left fused passed safe mode
    assert not [n for n in result.not_lowered if n.code == LowerReason.ERROR]
    assert not result.rolled_back, [(r.rule, r.code, r.message) for r in result.rolled_back]
    assert not result.notes
    assert result.lowered
    for low in result.lowered:
        assert result.safety[low.key].passed, (low.key, result.safety[low.key])
    got = set(result.fused_op_counts())
    want = EXPECTED_OPS[name]
    assert want <= got, f"{name}/{exporter}: fused {sorted(got)}, expected {sorted(want)}"
    _check_cpu_target(path, feeds, before, expected)  # the cpu target on the same export


def _check_cpu_target(path, feeds, before, expected):
    """Generated kernels: every planned group compiles and runs, the plan analyze() shows is
    what fuse() did, one fused node per kernel, outputs equal the export's and PyTorch's."""
    from graph_autofusion.options import FuseOptions
    from graph_autofusion.patterns.rewrite import FUSED_DOMAIN

    gaf = GraphAutoFusion(
        path,
        preset="all",
        hardware="x86_avx2",
        sample_inputs=feeds,
        options=FuseOptions(target="cpu", check_speed=False),
    )
    plan = gaf.analyze()
    gaf.fuse(check_speed=False)
    r = gaf.result
    assert sorted(c.key for c in plan.chosen) == sorted(
        [low.key for low in r.lowered] + [b.key for b in r.rolled_back]
    )
    assert not r.rolled_back, [(b.key, b.code, b.message) for b in r.rolled_back]
    assert r.lowered, r.analysis.code_counts()
    fused = [n for n in r.model.graph.nodes if n.domain == FUSED_DOMAIN]
    assert len(fused) == len(r.lowered) == r.program.kernel_nodes
    got = gaf.run(feeds)
    # the unfused operators run on torch's kernels, not onnxruntime's: compared by cosine
    # with the export (a deep CNN differs by ~1e-4 between the two conv libraries), closely
    # with PyTorch
    from graph_autofusion.verify.compare import compare_tensors

    for out_name, want in before.items():
        assert compare_tensors(got[out_name], want)["cosine"] >= 0.9999, out_name
    np.testing.assert_allclose(got["out"], expected, rtol=1e-3, atol=1e-4)

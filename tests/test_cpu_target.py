"""The cpu target end to end on the zoo: generated kernels for every planned group, the rest on
torch's kernels.

For every zoo model and both exporters: every planned group lowers and compiles, the number of
fused kernels equals the plan's groups (and the fused nodes in the graph), ``analyze()``
shows exactly the plan ``fuse()`` carried out, and ``run()`` matches the original export in
onnxruntime (cosine >= 0.9999). Safe mode's speed check is off (tests assert behaviour, not
timings); its numerics check is on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from graph_autofusion import GraphAutoFusion  # noqa: E402
from graph_autofusion.options import FuseOptions  # noqa: E402
from graph_autofusion.patterns.rewrite import FUSED_DOMAIN  # noqa: E402
from graph_autofusion.runtime.timing import use_timer  # noqa: E402
from graph_autofusion.testing import ort_outputs  # noqa: E402
from graph_autofusion.testing.models import EXPORTERS, MODEL_NAMES, example_feeds, export_onnx  # noqa: E402
from graph_autofusion.verify.compare import compare_tensors  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("models")]

OPTIONS = FuseOptions(target="cpu", check_speed=False)


def fuse_cpu(path, feeds, hardware="host"):
    gaf = GraphAutoFusion(
        str(path), preset="all", hardware=hardware, sample_inputs=feeds, options=OPTIONS
    )
    plan = gaf.analyze()
    gaf.fuse(check_speed=False)
    return gaf, plan


def check_cpu_result(gaf, plan, original_path, feeds):
    r = gaf.result
    # the plan analyze() shows is what fuse() did: every chosen group fused or rolled back
    assert sorted(c.key for c in plan.chosen) == sorted(
        [low.key for low in r.lowered] + [b.key for b in r.rolled_back]
    )
    assert not [b for b in r.rolled_back if b.code != "numerics"], r.rolled_back
    # one kernel per fused group (kernel-count assertions, as tinygrad's tests do)
    fused_nodes = [n for n in r.model.graph.nodes if n.domain == FUSED_DOMAIN]
    assert len(fused_nodes) == len(r.lowered) == r.program.kernel_nodes
    assert r.kernel_counts()["groups"] == len(r.lowered)
    assert r.kernel_counts()["functions"] <= len(r.lowered)
    assert r.end_to_end["passed"], r.end_to_end
    got = gaf.run(feeds)
    want = ort_outputs(original_path, feeds)
    for name, w in want.items():
        cmp = compare_tensors(got[name], w)
        assert cmp["cosine"] >= 0.9999, (name, cmp)
    return r


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_zoo_model_through_the_cpu_target(name, exporter):
    path = export_onnx(name, exporter)
    feeds = example_feeds(name)
    # a shipped profile: on this machine's calibration ResNet-50's groups can all be close
    # calls (maybe), which a fuse without speed checks does not plan
    gaf, plan = fuse_cpu(path, feeds, hardware="x86_avx2")
    r = check_cpu_result(gaf, plan, path, feeds)
    if name != "lstm":  # the LSTM export is one opaque LSTM node and a few layout ops
        assert r.lowered, r.analysis.code_counts()


def test_compile_fused_operators_writes_sources_library_and_manifest(tmp_path):
    path = export_onnx("bert", "torchscript")
    feeds = example_feeds("bert")
    gaf, _ = fuse_cpu(path, feeds)
    out = tmp_path / "kernels"
    data = gaf.compile_fused_operators(out)
    assert sorted(p.name for p in out.iterdir()) == ["kernels.c", "kernels.so", "manifest.json"]
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == data
    assert len(data["groups"]) == len(gaf.result.lowered)
    assert {g["kernel"] for g in data["groups"]} == {k["name"] for k in data["kernels"]}
    src = (out / "kernels.c").read_text()
    for k in data["kernels"]:
        assert f"void {k['name']}_g(" in src and k["fused_ops"]
    prof = gaf.profile_fusion_kernel(0, runs=3)
    assert prof["kernel_us"] > 0 and prof["unfused_us"] > 0 and prof["bytes"] > 0
    assert prof["bandwidth_gb_s"] > 0 and 0 < prof["bandwidth_fraction"]


def test_run_before_fuse_and_unknown_kernel_are_clear_errors():
    from graph_autofusion.api import NotFusedYetError
    from graph_autofusion.errors import GraphAutoFusionError

    path = export_onnx("minilm", "torchscript")
    gaf = GraphAutoFusion(str(path), target="cpu", sample_inputs=example_feeds("minilm"))
    with pytest.raises(NotFusedYetError):
        gaf.run()
    gaf.fuse(check_speed=False)
    with pytest.raises(GraphAutoFusionError, match="no fused kernel"):
        gaf.profile_fusion_kernel("nope")
    ort_gaf = GraphAutoFusion(str(path), sample_inputs=example_feeds("minilm"))
    ort_gaf.fuse(check_speed=False)
    with pytest.raises(GraphAutoFusionError, match="target='cpu'"):
        ort_gaf.compile_fused_operators("unused")
    out = ort_gaf.run()
    assert set(out) == {o for o in ort_outputs(path, example_feeds("minilm"))}
    assert all(isinstance(v, np.ndarray) for v in out.values())


def test_safe_mode_times_every_kernel_and_rolls_back_a_kernel_that_fails_to_compile(
    monkeypatch,
):
    """One kernel the C compiler rejects is rolled back alone with the compiler's message;
    the others are timed against their unfused operators (behaviour, not speed, is asserted)."""
    from graph_autofusion.codegen import c_backend
    from graph_autofusion.codegen.lower import KernelReason

    path = export_onnx("minilm", "torchscript")
    feeds = example_feeds("minilm")
    gaf = GraphAutoFusion(str(path), sample_inputs=feeds, target="cpu")
    timed = []

    def kernel_is_faster(key, side, fn):  # the runs are real, the verdict is set
        fn()
        timed.append((key, side))
        return 5e-6 if side == "fused" else 10e-6

    with use_timer(kernel_is_faster):
        gaf.fuse()  # speed check on
    base = gaf.result
    assert base.lowered and not base.rolled_back, base.rolled_back
    for low in base.lowered:
        res = base.safety[low.key]
        assert (res.time_unfused_us, res.time_fused_us) == pytest.approx((10.0, 5.0))
        assert (low.key, "fused") in timed and (low.key, "unfused") in timed
    # a kernel the cost model chose outright: a close call (``maybe``) is planned only when
    # the speed check measures it, and the second fuse runs without one
    firm = {ca.key for ca in base.analysis.candidates if ca.verdict.value == "fuse"}
    victim = next(g.kernel.name for g in base.kernels if g.key in firm)
    real = c_backend.kernel_source

    def broken(kernel, **kw):
        src = real(kernel, **kw)
        return src + "\n#error injected failure\n" if kernel.name == victim else src

    monkeypatch.setattr(c_backend, "kernel_source", broken)
    gaf2 = GraphAutoFusion(str(path), sample_inputs=feeds, options=OPTIONS)
    gaf2.fuse(check_speed=False)
    r = gaf2.result
    failed = [b for b in r.rolled_back if b.code == KernelReason.COMPILE_FAILED]
    assert failed and all("injected failure" in b.message for b in failed)
    assert {b.key for b in failed} == {g.key for g in base.kernels if g.kernel.name == victim}
    assert r.lowered and all(low.payload.kernel.name != victim for low in r.lowered)
    assert r.end_to_end["passed"]


def test_analyze_lists_what_the_other_target_would_fuse(capsys):
    from graph_autofusion.cli import main

    path = export_onnx("minilm", "torchscript")
    gaf = GraphAutoFusion(str(path), sample_inputs=example_feeds("minilm"))
    report = gaf.analyze(other_targets=True)
    assert report.target == "onnxruntime"
    assert set(report.other_targets) == {"cpu"} and report.other_targets["cpu"]["fusions"] > 0
    assert "the cpu target would fuse" in report.to_text()
    assert main(["analyze", str(path), "--target", "cpu", "--compare-targets", "--brief"]) == 0
    out = capsys.readouterr().out
    assert "plan for the cpu target" in out and "the onnxruntime target would fuse" in out


def test_a_pytorch_module_runs_on_the_cpu_target():
    import torch

    from graph_autofusion.pipeline.result import e2e_passed

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(64)
            self.fc = torch.nn.Linear(64, 128)

        def forward(self, x, r):
            return torch.nn.functional.gelu(self.fc(self.ln(x + r))) * 2.0

    torch.manual_seed(0)
    m = Block().eval()
    x, r = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    gaf = GraphAutoFusion(m, example_inputs=(x, r), target="cpu", hardware="x86_avx2")
    gaf.fuse(check_speed=False)
    # gaf.result: the fuse result of the engine that runs the graph (either engine's form)
    assert gaf.result.lowered and e2e_passed(gaf.result.end_to_end)
    feeds = gaf.feeds()
    (got,) = gaf.run(feeds).values()
    with torch.no_grad():
        want = m(*[torch.from_numpy(feeds[k]) for k in ("x", "r")])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_both_pipelines_dump_their_stage_artifacts(tmp_path):
    from graph_autofusion.frontend.onnx_frontend import load_onnx
    from graph_autofusion.patterns.library import builtin_rules
    from graph_autofusion.pipeline import fuse_model
    from graph_autofusion.pipeline.cpu import fuse_model_cpu
    from graph_autofusion.pipeline.stages import STAGES

    path = export_onnx("minilm", "torchscript")
    feeds = example_feeds("minilm")
    model = load_onnx(str(path))
    rules = builtin_rules()
    opts = FuseOptions(check_speed=False)
    r = fuse_model(model, rules, "host", options=opts, feeds=feeds, dump_dir=tmp_path / "ort")
    assert sorted(p.name for p in (tmp_path / "ort").iterdir()) == [
        "fused.onnx",
        "lowered.txt",
        "plan.json",
    ]
    assert {"plan", "lower", "capture", "verify", "end_to_end"} <= set(r.timings) <= set(STAGES)
    c = fuse_model_cpu(
        model, rules, "host", options=OPTIONS, feeds=feeds, dump_dir=tmp_path / "cpu"
    )
    assert sorted(p.name for p in (tmp_path / "cpu").iterdir()) == ["kernels.txt", "plan.json"]
    assert {"plan", "lower", "compile", "rewrite", "verify", "end_to_end"} <= set(c.timings)
    assert {k for k in c.timings if "." not in k} <= set(STAGES)  # plan.bind etc.: sub-stages


def test_the_numpy_reference_backend_runs_the_same_plan_when_asked_for():
    path = export_onnx("minilm", "torchscript")
    feeds = example_feeds("minilm")
    opts = OPTIONS.replace(backend="reference")
    gaf = GraphAutoFusion(str(path), sample_inputs=feeds, options=opts)
    gaf.fuse(check_speed=False)
    r = gaf.result
    assert r.library is None and r.lowered and r.end_to_end["passed"]
    want = ort_outputs(path, feeds)
    got = gaf.run(feeds)
    for name, w in want.items():
        assert compare_tensors(got[name], w)["cosine"] >= 0.9999

"""``graph-autofusion demo``: the main job on the built-in demo model (real-weight MiniLM-L6).

Today the job is: export the model with both torch exporters, import each into the IR, print
the inspection, write the IR back to ONNX and check onnxruntime gives identical outputs, run
the NumPy reference interpreter against onnxruntime, and import the PyTorch module directly
and run the IR on torch tensors against eager PyTorch. Then the fusion job: list the fusion
candidates, fuse the dynamo export for onnxruntime with safe mode on (every fusion verified on
real activations), print the safe-fusion report, and check the fused model's sentence
embeddings against the original's.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np


def _ort_run(path: str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def run_demo(seq_len: int = 16) -> int:
    """Run the demo and print what each stage did. Returns 0 when every check passed."""
    import torch

    from graph_autofusion.frontend.onnx_frontend import load_onnx, save_onnx
    from graph_autofusion.frontend.torch_frontend import from_torch
    from graph_autofusion.report.inspect import inspect_model
    from graph_autofusion.runtime.interpreter import run_model
    from graph_autofusion.runtime.torch_runtime import TorchRunner
    from graph_autofusion.testing.models import (
        build_model,
        example_feeds,
        export_onnx,
        minilm_sentence_embeddings,
    )

    ok = True
    feeds = example_feeds("minilm", seq_len=seq_len)
    for exporter in ("dynamo", "torchscript"):
        t0 = time.perf_counter()
        path = export_onnx("minilm", exporter, seq_len=seq_len)
        model = load_onnx(path)
        print(f"== MiniLM-L6 (real weights), {exporter} export: {path.name}")
        print(inspect_model(model, name=f"minilm/{exporter}").to_text())
        ref = _ort_run(path, feeds)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "roundtrip.onnx"
            save_onnx(model, out)
            again = _ort_run(out, feeds)
        rt_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, again))
        names = [v.name for v in model.graph.outputs]
        interp = run_model(
            model, {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.inputs}}
        )
        ip_diff = max(float(np.max(np.abs(interp[n] - r))) for n, r in zip(names, ref))
        ok &= rt_diff == 0.0 and ip_diff <= 1e-4
        print(f"IR round trip vs original in onnxruntime: max abs diff {rt_diff:.3g}")
        print(f"reference interpreter vs onnxruntime:     max abs diff {ip_diff:.3g}")
        print(f"({time.perf_counter() - t0:.1f} s)\n")

    module, inputs = build_model("minilm", seq_len=seq_len)
    t0 = time.perf_counter()
    model = from_torch(module, (), dict(inputs))
    runner = TorchRunner(model)
    with torch.no_grad():
        eager = module(**inputs)
        eager = eager if isinstance(eager, torch.Tensor) else eager[0]
        got = runner(**inputs)
        got = got if isinstance(got, torch.Tensor) else got[0]
    real = inputs["attention_mask"][0].bool()
    t_diff = float((got - eager)[0][real].abs().max())
    emb_a = minilm_sentence_embeddings(eager, inputs["attention_mask"])
    emb_b = minilm_sentence_embeddings(got, inputs["attention_mask"])
    cos = float(torch.nn.functional.cosine_similarity(emb_a, emb_b, dim=-1).min())
    ok &= t_diff <= 1e-5 and cos >= 0.99999
    print(f"== MiniLM-L6 imported from PyTorch: {len(model.graph)} IR nodes")
    print(f"torch-backed IR run vs eager PyTorch:     max abs diff {t_diff:.3g} (real tokens)")
    print(f"sentence embedding cosine vs eager:       {cos:.9f}")
    print(f"({time.perf_counter() - t0:.1f} s)\n")

    ok &= _fuse_stage(export_onnx("minilm", "dynamo", seq_len=seq_len), feeds)
    print("demo: all checks passed" if ok else "demo: SOME CHECKS FAILED")
    return 0 if ok else 1


def _fuse_stage(path: Path, feeds: dict[str, np.ndarray]) -> bool:
    """Candidates, safe fusion for onnxruntime, the report, and the embeddings check."""
    import torch

    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.testing.models import minilm_sentence_embeddings

    t0 = time.perf_counter()
    gaf = GraphAutoFusion(path, preset="transformer", sample_inputs=feeds)
    counts = {k: v for k, v in gaf.candidates().rules.counts().items() if v}
    print(f"== fusion candidates (transformer preset): {counts}")
    fused = gaf.fuse()
    print(gaf.safe_fusion_report().to_text())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fused.onnx"
        out.write_bytes(to_onnx(fused).SerializeToString())
        got = _ort_run(out, feeds)[0]
    ref = _ort_run(path, feeds)[0]
    mask = torch.from_numpy(feeds["attention_mask"])
    emb_a = minilm_sentence_embeddings(torch.from_numpy(ref), mask)
    emb_b = minilm_sentence_embeddings(torch.from_numpy(got), mask)
    cos = float(torch.nn.functional.cosine_similarity(emb_a, emb_b, dim=-1).min())
    fused_count = len(gaf.result.lowered)
    print(f"fused model, sentence embedding cosine vs original: {cos:.9f} ({fused_count} fusions)")
    print(f"({time.perf_counter() - t0:.1f} s)\n")
    return cos >= 0.99999

"""Where a linear layer's bias goes before a GELU: onnxruntime's ``Gemm`` or our ``BiasGelu``.

    .venv/bin/python benchmarks/bias_placement.py [--rounds 60] [--out benchmarks/results/epyc]

onnxruntime ALL folds a ``MatMul`` and a bias ``Add`` into one ``Gemm`` (``MatMulAddFusion``;
for an N-D input of static shape, between two ``Reshape`` nodes); our ``bias_gelu`` fusion
leaves the ``MatMul`` alone and adds the bias in ``BiasGelu``. Two measurements decide which
form is faster:

1. **One layer**, one-node sessions at ALL (2 threads, spinning workers, input warm, variants in
   rotating order, each after a 50 ms pause; median of 30 runs per round, median over rounds): ``MatMul`` alone,
   ``MatMul`` then ``Add`` kept apart (``FusedMatMul``, which the fold does not match), and
   ``MatMul`` + ``Add`` as onnxruntime folds it, at ConvNeXt-T's and transformers' shapes.
2. **ConvNeXt-T at 224**, whole model (``--rounds`` paired rounds, rotating order, a 50 ms pause
   and one untimed call before each timed one): our default fused model (``MatMul`` +
   ``BiasGelu``); the same model with each such ``BiasGelu`` written back as ``Add`` + ``Gelu``
   so onnxruntime folds the bias into its ``Gemm`` (the form before this question was
   measured); ours with custom operators (``GeluErf``); onnxruntime ALL and OpenVINO on the
   export.

Writes ``bias_placement.json`` / ``.md`` with the CPU model and ISA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (label, leading shape, K, N)
LAYERS = (
    ("ConvNeXt-T 56x56 pwconv1", (1, 56, 56), 96, 384),
    ("ConvNeXt-T 56x56 pwconv2", (1, 56, 56), 384, 96),
    ("ConvNeXt-T 28x28 pwconv1", (1, 28, 28), 192, 768),
    ("ConvNeXt-T 14x14 pwconv1", (1, 14, 14), 384, 1536),
    ("BERT-base s128 FFN up", (1, 128), 768, 3072),
    ("BERT-base s128 FFN down", (1, 128), 3072, 768),
    ("BERT-base s16 FFN up", (1, 16), 768, 3072),
)
FORMS = ("MatMul alone", "MatMul, Add apart", "MatMul + Add folded by onnxruntime")


def _layer_model(form: str, lead: tuple, k: int, n: int, rng: Any) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array((0.05 * rng.standard_normal((k, n))).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    if form == "MatMul alone":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    elif form == "MatMul, Add apart":
        mm = helper.make_node("FusedMatMul", ["x", "w"], ["m"], domain="com.microsoft", alpha=1.0)
        nodes = [mm, helper.make_node("Add", ["m", "b"], ["y"])]
    else:
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["y"]),
        ]
    graph = helper.make_graph(
        nodes,
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])],
        [w, b],
    )
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=ops).SerializeToString()


def _median_ms(fn: Any, runs: int = 30) -> float:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def layers(rounds: int) -> list[dict]:
    from peers import SPIN_SETTLE_S

    from graph_autofusion.runtime.ort_session import ort_session

    rng = np.random.default_rng(0)
    rows = []
    for label, lead, k, n in LAYERS:
        x = rng.standard_normal((*lead, k)).astype(np.float32)
        sess = {
            f: ort_session(_layer_model(f, lead, k, n, rng), "all", 2, spinning=True) for f in FORMS
        }
        times: dict[str, list[float]] = {f: [] for f in FORMS}
        for r in range(rounds):
            for f in FORMS[r % 3 :] + FORMS[: r % 3]:
                run = sess[f].run
                feeds = {"x": x}
                time.sleep(SPIN_SETTLE_S)  # the last form's spinning workers stop first
                run(None, feeds)
                times[f].append(_median_ms(lambda run=run, feeds=feeds: run(None, feeds)))
        med = {f: round(float(np.median(t)), 3) for f, t in times.items()}
        rows.append({"layer": label, "rows": int(np.prod(lead)), "k": k, "n": n, "ms": med})
        print(f"{label}: " + ", ".join(f"{f} {v:.3f} ms" for f, v in med.items()), flush=True)
    return rows


def bias_in_gemm(path: str, out: str) -> int:
    """``path``'s fused model with each ``BiasGelu(MatMul(..), b)`` written as ``Add`` + ``Gelu``
    (onnxruntime then folds the bias into its ``Gemm``); returns how many."""
    import onnx
    from onnx import helper

    m = onnx.load(path)
    made = {o: n for n in m.graph.node for o in n.output}
    nodes, count = [], 0
    for node in m.graph.node:
        src = made.get(node.input[0]) if node.input else None
        if node.op_type == "BiasGelu" and src is not None and src.op_type == "MatMul":
            add = helper.make_node("Add", list(node.input), [node.output[0] + "_biased"])
            gelu = helper.make_node(
                "Gelu", [add.output[0]], list(node.output), domain="com.microsoft"
            )
            nodes += [add, gelu]
            count += 1
        else:
            nodes.append(node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.save(m, out)
    return count


def convnext(rounds: int) -> dict:
    from op_profile import timed_session
    from peers import PRE_CALLS, SPIN_SETTLE_S, OpenVINOSession

    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.runtime.timing import round_robin
    from graph_autofusion.testing import example_feeds, export_onnx

    path = str(export_onnx("convnext", "dynamo"))
    feeds = example_feeds("convnext", seq_len=224, batch=1)
    work = tempfile.mkdtemp(prefix="gaf_bias_")
    paths = {}
    for tag, custom in (("ours (BiasGelu)", False), ("ours, custom operators (GeluErf)", True)):
        gaf = GraphAutoFusion(path, preset="all", sample_inputs=feeds)
        if custom:
            gaf.options = gaf.options.replace(custom_ops=True)
        gaf.fuse()
        paths[tag] = os.path.join(work, f"{len(paths)}.onnx")
        gaf.save(paths[tag])
    paths["ours, bias in onnxruntime's Gemm"] = os.path.join(work, "gemm.onnx")
    rewritten = bias_in_gemm(paths["ours (BiasGelu)"], paths["ours, bias in onnxruntime's Gemm"])
    sessions = {k: timed_session(p, "all", ours=True) for k, p in paths.items()}
    sessions["onnxruntime ALL"] = timed_session(path, "all", ours=False)
    sessions["OpenVINO"] = OpenVINOSession(path)
    ins = {k: {i.name: feeds[i.name] for i in s.get_inputs()} for k, s in sessions.items()}
    ref = sessions["onnxruntime ALL"].run(None, ins["onnxruntime ALL"])[0]
    diff = {k: float(np.abs(s.run(None, ins[k])[0] - ref).max()) for k, s in sessions.items()}
    fns = {k: (lambda k=k: sessions[k].run(None, ins[k])) for k in sessions}
    got = round_robin(
        fns, rounds, warmup=3, rotate=True, settle_s=SPIN_SETTLE_S, pre_calls=PRE_CALLS
    )
    ms = {k: np.array(v) * 1e3 for k, v in got.items()}
    base = ms["onnxruntime ALL"]
    return {
        "bias_gelus_rewritten": rewritten,
        "configs": {
            k: {
                "ms": round(float(np.median(v)), 2),
                "p10": round(float(np.percentile(v, 10)), 2),
                "p90": round(float(np.percentile(v, 90)), 2),
                # per round: this configuration over onnxruntime ALL in the same round
                "paired_vs_ort_all": round(float(np.median(v / base)), 3),
                "paired_vs_openvino": round(float(np.median(v / ms["OpenVINO"])), 3),
                "max_abs_diff_vs_ort_all": diff[k],
            }
            for k, v in ms.items()
        },
    }


def markdown(data: dict) -> str:
    mc = data["machine"]
    out = [
        "# Where a linear layer's bias goes before a GELU",
        "",
        f"`benchmarks/bias_placement.py` on {mc['cpu']} ({', '.join(mc['isa'])}); onnxruntime "
        f"{mc['onnxruntime']}, OpenVINO {mc.get('openvino')}; {mc['date']}, commit "
        f"{mc['commit']}{' (dirty)' if mc['dirty'] else ''}; load {mc['load']}; 2 threads.",
        "",
        "## One layer (ms; median over rounds of the median of 30 runs)",
        "",
        "| layer | rows x K -> N | " + " | ".join(FORMS) + " | folded / apart |",
        "|---|---|" + "---:|" * (len(FORMS) + 1),
    ]
    for r in data["layers"]:
        ms = r["ms"]
        ratio = ms[FORMS[2]] / ms[FORMS[1]]
        out.append(
            f"| {r['layer']} | {r['rows']} x {r['k']} -> {r['n']} | "
            + " | ".join(f"{ms[f]:.3f}" for f in FORMS)
            + f" | {ratio:.2f} |"
        )
    c = data["convnext"]
    out += [
        "",
        f"## ConvNeXt-T at 224, whole model ({data['rounds']} paired rounds; "
        f"{c['bias_gelus_rewritten']} BiasGelu written back for the Gemm variant)",
        "",
        "| configuration | ms median (p10-p90) | / onnxruntime ALL (paired) | / OpenVINO (paired) "
        "| max abs diff vs onnxruntime ALL |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, v in c["configs"].items():
        out.append(
            f"| {k} | {v['ms']:.2f} ({v['p10']:.2f}-{v['p90']:.2f}) | {v['paired_vs_ort_all']:.3f} "
            f"| {v['paired_vs_openvino']:.3f} | {v['max_abs_diff_vs_ort_all']:.1e} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from torch_e2e_engines import machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60, help="whole-model paired rounds")
    ap.add_argument("--layer-rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    data = {"machine": machine(), "rounds": args.rounds}
    data["layers"] = layers(args.layer_rounds)
    data["convnext"] = convnext(args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bias_placement.json").write_text(json.dumps(data, indent=1))
    text = markdown(data)
    (args.out / "bias_placement.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

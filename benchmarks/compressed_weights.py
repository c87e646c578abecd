"""Compressed weights (issue 22): the zoo Llama's decode ms/token with fp32, fp16, int8 and
int4 weights on our ONNX route, against the fp32 peers, with the machine's streaming bandwidth.

Configurations, all on the zoo Llama's KV-cache decoder export (``--exporter``, dynamo by
default), each an onnxruntime session (CPU, 2 intra-op threads, ``ORT_ENABLE_ALL``) or
OpenVINO (f32 inference precision, 2 threads; ``benchmarks/torch_e2e_engines.py``):

* ``ours_fp32``, ``ours_fp16``, ``ours_int8``, ``ours_int4`` (``_all``: ``weights_policy="all"``):
  ``GraphAutoFusion(path, preset="llm",
  sample_inputs=<one decode step at past 64>, options=FuseOptions(weights=...)).fuse()`` (safe
  mode on; each compressed layer verified), saved, then opened from the saved file;
* ``dropin_fp32``, ``dropin_fp16``, ``dropin_int8``: the PyTorch route, the zoo model as
  ``GraphAutoFusion(model, options=FuseOptions(weights=...)).fuse()`` and its ``generate()``
  (Hugging Face's for the first tokens, then our decode loop; ``--no-torch`` leaves them
  out); its weight bytes are those of the graph that served the most calls (the decode step);
* ``ort_all``: onnxruntime on the export; ``openvino``: OpenVINO on the export.

Decode: greedy generation after a 16-token prompt (``greedy_decode_ort``); ms/token is
``(time(n tokens) - time(1 token)) / (n - 1)``, "first token ms" the median ``time(1 token)``
(the prompt's prefill and its token), every configuration timed in a shuffled order
per round (``round_robin(rotate=True)``), as ``benchmarks/torch_e2e.py`` does. The streaming
bandwidth (``cost.calibrate.measure_bandwidth``, STREAM copy/triad) is measured before and
after the timing in the same process. "Weight GB/s" is the bytes of every contraction weight
a token reads (packed + scales + zero points for compressed layers, fp32 otherwise, the LM
head included; embeddings read one row and are left out) divided by the ms/token of the whole
step: a lower bound of what the GEMVs achieve (the step also runs attention and norms).

Also recorded: each configuration's greedy tokens against ours_fp32's, the saved files' sizes,
the per-layer report of the compressed models, and MiniLM's real weights (``--minilm``):
sentence-embedding cosine of int8 / int4 against fp32 on held-out sentences, with the
per-layer cosine / relative error safe mode measured.

    .venv/bin/python benchmarks/compressed_weights.py                  # writes the results
    .venv/bin/python benchmarks/compressed_weights.py --tokens 8 --runs 2 --out /tmp/cw
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (configuration, weights, weights_policy)
OURS = (
    ("ours_fp32", "fp32", "default"),
    ("ours_fp16", "fp16", "default"),
    ("ours_fp16_all", "fp16", "all"),
    ("ours_int8", "int8", "default"),
    ("ours_int4", "int4", "default"),
    ("ours_int8_all", "int8", "all"),
    ("ours_int4_all", "int4", "all"),
)
#: (configuration, weights): the PyTorch route, ``GraphAutoFusion(model, options=
#: FuseOptions(weights=...)).fuse().generate()`` (the drop-in module; its decode loop)
TORCH = (("dropin_fp32", "fp32"), ("dropin_fp16", "fp16"), ("dropin_int8", "int8"))
PEERS = ("ort_all", "openvino")
LABELS = {
    "ours_fp32": "our ONNX route, fp32",
    "ours_fp16": "our ONNX route, fp16 (head, embeddings fp32)",
    "ours_fp16_all": "our ONNX route, fp16 all (head, embeddings fp16)",
    "ours_int8": "our ONNX route, int8 (head, embeddings fp16)",
    "ours_int4": "our ONNX route, int4 (head int8, embeddings fp16)",
    "ours_int8_all": "our ONNX route, int8 all (head, embeddings int8)",
    "ours_int4_all": "our ONNX route, int4 all (head, embeddings int8)",
    "dropin_fp32": "drop-in module, fp32",
    "dropin_fp16": "drop-in module, fp16 (head, embeddings fp32)",
    "dropin_int8": "drop-in module, int8 (head, embeddings fp16)",
    "ort_all": "ORT ALL (export, fp32)",
    "openvino": "OpenVINO (export, f32)",
}
PROMPT = 16
GEN = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
SAMPLE_PAST = 64


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def token_weight_bytes(result: Any) -> int:
    """The contraction weights a decode step of ``result.model`` reads: the compressed-weights
    report's bytes (embeddings read a row per token and are left out), or with fp32 weights
    every contraction's as it is."""
    w = result.weights
    if w is not None:
        return int(sum(r.bytes for r in w.layers if r.op != "Gather"))
    from graph_autofusion.codegen.weights import find_sites

    sites = find_sites(result.model, min_elements=0, keep_head=False)
    return int(sum(s.fp32_bytes for s in sites if s.weight is not None))


def fuse(path: Path, name: str, form: str, policy: str, out: str) -> dict[str, Any]:
    """Our ONNX route with ``weights=form, weights_policy=policy``, saved to ``out``."""
    from vs_ort_decode import DECODERS, decode_feeds

    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.options import FuseOptions

    t = time.perf_counter()
    gaf = GraphAutoFusion(
        str(path),
        preset=DECODERS[name][2],
        sample_inputs=decode_feeds(name, SAMPLE_PAST),
        options=FuseOptions(weights=form, weights_policy=policy),
    )
    gaf.fuse()
    fuse_s = time.perf_counter() - t
    gaf.save(out)
    w = gaf.result.weights
    weight_bytes = token_weight_bytes(gaf.result)
    return {
        "fuse_s": round(fuse_s, 2),
        "file_bytes": os.path.getsize(out),
        "weight_bytes_per_token": int(weight_bytes),
        "weights": w.to_dict() if w is not None else None,
        "notes": list(gaf.result.notes),
    }


def bandwidth() -> dict[str, Any]:
    from graph_autofusion.cost.calibrate import measure_bandwidth

    gbs, how = measure_bandwidth(quick=False)
    return {"gbs": round(gbs, 1), "how": how}


def minilm_accuracy() -> dict[str, Any]:
    """MiniLM (real weights): int8 / int4 sentence embeddings against fp32's, fused on the
    example sentence, measured on the check sentences."""
    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.options import FuseOptions
    from graph_autofusion.testing.export import (
        example_feeds,
        export_onnx,
        minilm_onnx_embeddings,
    )

    path = export_onnx("minilm", "dynamo")
    feeds = example_feeds("minilm")
    ref = minilm_onnx_embeddings(str(path))
    out: dict[str, Any] = {"export": path.name}
    for form in ("int8", "int4"):
        gaf = GraphAutoFusion(str(path), sample_inputs=feeds, options=FuseOptions(weights=form))
        model = gaf.fuse(check_speed=False)
        emb = minilm_onnx_embeddings(model)
        cos = np.sum(emb * ref, axis=1) / (
            np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1)
        )
        w = gaf.result.weights
        done = w.compressed
        out[form] = {
            "sentence_cosine_min": float(cos.min()),
            "sentence_cosine_mean": float(cos.mean()),
            "compressed": len(done),
            "kept_fp32": len(w.kept),
            "layer_cosine_min": min((r.cosine for r in done), default=None),
            "layer_rel_err_median": (
                float(statistics.median(r.rel_err for r in done)) if done else None
            ),
            "layer_rel_err_max": max((r.rel_err for r in done), default=None),
            "end_to_end": w.end_to_end,
        }
        log(f"minilm {form}: {out[form]['sentence_cosine_min']:.6f} min sentence cosine")
    return out


def dropin(name: str, form: str) -> tuple[Any, dict[str, Any]]:
    """The zoo model as a drop-in fused module with ``weights=form`` (fused on its example
    call, then one generate() so its decode graphs exist), and what its decode graph reads
    per token."""
    import torch

    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.options import FuseOptions
    from graph_autofusion.testing.builders import build_model

    model = build_model(name)[0].model.eval()
    t = time.perf_counter()
    fused = GraphAutoFusion(model, options=FuseOptions(weights=form)).fuse()
    ids = torch.zeros((1, PROMPT), dtype=torch.long)
    with torch.no_grad():
        fused.generate(ids, max_new_tokens=12, **GEN)
    fuse_s = time.perf_counter() - t
    step = max(fused.autofusion.graphs, key=lambda g: g.calls)  # the decode loop's graph
    res = step.ort_result
    if res is None:
        return fused, {"fuse_s": round(fuse_s, 2), "decode_engine": step.engine}
    w = res.weights
    weight_bytes = token_weight_bytes(res)
    return fused, {
        "fuse_s": round(fuse_s, 2),
        "decode_engine": step.engine,
        "weight_bytes_per_token": int(weight_bytes),
        "weights": w.to_dict() if w is not None else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from torch_e2e_engines import OpenVINOSession, Unavailable, machine

    from graph_autofusion.runtime.ort_session import ort_session
    from graph_autofusion.runtime.timing import round_robin, summarize
    from graph_autofusion.testing.kv_cache import export_decoder, greedy_decode_ort

    name, n = args.model, args.tokens
    data: dict[str, Any] = {"machine": machine(), "model": name, "tokens": n, "runs": args.runs}
    data["bandwidth_before"] = bandwidth()
    log(f"bandwidth {data['bandwidth_before']['gbs']} GB/s")
    path = export_decoder(name, args.exporter)
    data["export"] = {"path": path.name, "file_bytes": os.path.getsize(path)}
    prompt = np.random.default_rng(0).integers(0, 1000, (1, PROMPT)).astype(np.int64)
    configs: dict[str, dict[str, Any]] = {}
    sessions: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, form, policy in OURS:
            log(f"fuse {key}")
            out = os.path.join(tmp, f"{key}.onnx")
            configs[key] = fuse(path, name, form, policy, out)
            sessions[key] = ort_session(out, "all", 2)
        sessions["ort_all"] = ort_session(path, "all", 2)
        configs["ort_all"] = {}
        try:
            sessions["openvino"] = OpenVINOSession(path)
            configs["openvino"] = {}
        except Unavailable as exc:
            configs["openvino"] = {"unavailable": str(exc)}
        modules = {}
        if args.torch:
            import torch

            torch.set_num_threads(2)
            for key, form in TORCH:
                log(f"fuse {key}")
                modules[key], configs[key] = dropin(name, form)
        fp32_bytes = configs["ours_fp32"]["weight_bytes_per_token"]
        for key in PEERS:
            if key in sessions:
                configs[key]["weight_bytes_per_token"] = fp32_bytes
        want = greedy_decode_ort(sessions["ours_fp32"], name, prompt, n - 1)[0]
        fns = {}
        for key, sess in sessions.items():
            tokens = greedy_decode_ort(sess, name, prompt, n - 1)[0]
            configs[key]["same_tokens_as_fp32"] = sum(a == b for a, b in zip(tokens, want)) / n
            fns[f"{key}:{n}"] = lambda s=sess: greedy_decode_ort(s, name, prompt, n - 1)
            fns[f"{key}:1"] = lambda s=sess: greedy_decode_ort(s, name, prompt, 0)
        for key, mod in modules.items():
            ids = torch.from_numpy(prompt)

            def gen(k: int, m: Any = mod, ids: Any = ids) -> Any:
                with torch.no_grad():
                    return m.generate(ids, max_new_tokens=k, **GEN)

            tokens = gen(n)[0, PROMPT:].tolist()
            configs[key]["same_tokens_as_fp32"] = sum(a == b for a, b in zip(tokens, want)) / n
            fns[f"{key}:{n}"] = lambda g=gen: g(n)
            fns[f"{key}:1"] = lambda g=gen: g(1)
        log(f"timing {len(sessions) + len(modules)} configurations, {args.runs} rounds, {n} tokens")
        raw = round_robin(fns, args.runs, warmup=1, rotate=True)
        for key in (*sessions, *modules):
            per_token = [(a - b) / (n - 1) for a, b in zip(raw[f"{key}:{n}"], raw[f"{key}:1"])]
            stats = summarize({key: per_token})[key]
            configs[key].update({k: round(v, 3) for k, v in stats.items()})
            # the prompt and its first token (prefill, where compressed forms may be slower)
            configs[key]["first_token_ms"] = round(1e3 * statistics.median(raw[f"{key}:1"]), 3)
            wb = configs[key].get("weight_bytes_per_token")
            if wb:
                configs[key]["weight_gbs"] = round(wb / (stats["ms"] * 1e-3) / 1e9, 1)
        sessions.clear()
        modules.clear()
    data["bandwidth_after"] = bandwidth()
    data["configs"] = configs
    stream = max(data["bandwidth_before"]["gbs"], data["bandwidth_after"]["gbs"])
    data["stream_gbs"] = stream
    base = configs["ours_fp32"].get("ms")
    for c in configs.values():
        if "ms" in c and base:
            c["vs_ours_fp32"] = round(c["ms"] / base, 3)
        if "weight_gbs" in c:
            c["of_stream"] = round(c["weight_gbs"] / stream, 3)
    if args.minilm:
        log("MiniLM accuracy (real weights)")
        data["minilm"] = minilm_accuracy()
    return data


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# Compressed weights: zoo Llama decode",
        "",
        f"{m['cpu']} ({', '.join(m['isa']) or 'none of the listed ISA flags'}), "
        f"{m['threads']} threads; onnxruntime {m['onnxruntime']}, OpenVINO {m['openvino']}; "
        f"{m['date']}, commit {m['commit']}{' (dirty)' if m['dirty'] else ''}; load {m['load']}.",
        f"Streaming bandwidth in the same run: {data['bandwidth_before']['gbs']} GB/s before, "
        f"{data['bandwidth_after']['gbs']} GB/s after ({data['bandwidth_before']['how']}).",
        f"Greedy decode of {data['tokens']} tokens after a {PROMPT}-token prompt, "
        f"{data['runs']} rounds in a shuffled order; ms/token median (p10-p90).",
        "",
        "| configuration | ms/token | vs our fp32 | first token ms | weight MB/token "
        "| weight GB/s | of stream | file MB | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, c in data["configs"].items():
        if "ms" not in c:
            lines.append(f"| {LABELS[key]} | {c.get('unavailable', 'n/a')} | | | | | | | |")
            continue
        wb = c.get("weight_bytes_per_token")
        fb = c.get("file_bytes")
        first = c.get("first_token_ms")
        lines.append(
            f"| {LABELS[key]} | {c['ms']:.2f} ({c['p10']:.2f}-{c['p90']:.2f}) | "
            f"{c.get('vs_ours_fp32', 0):.2f}x | {f'{first:.1f}' if first else ''} | "
            f"{wb / 1e6 if wb else 0:.1f} | "
            f"{c.get('weight_gbs', '')} | {c.get('of_stream', '')} | "
            f"{fb / 1e6 if fb else 0:.1f} | {100 * c['same_tokens_as_fp32']:.0f}% |"
        )
    for key, _form, _policy in OURS[1:]:
        w = data["configs"][key].get("weights")
        if w:
            e2e = ", ".join(
                f"{k} cosine {v['cosine']:.5f} rel {v['rel_err']:.3f}"
                for k, v in (w["end_to_end"] or {}).items()
            )
            lines.append(
                f"\n{LABELS[key]}: {w['compressed']} layers compressed, {w['kept_fp32']} kept "
                f"fp32; end to end (safe mode's sample inputs): {e2e}"
            )
    if "minilm" in data:
        lines += ["", "## MiniLM, real weights", ""]
        lines.append("| form | sentence cosine min | layers | layer cosine min | rel err median |")
        lines.append("|---|---|---|---|---|")
        for form in ("int8", "int4"):
            r = data["minilm"][form]
            lines.append(
                f"| {form} | {r['sentence_cosine_min']:.6f} | {r['compressed']} compressed, "
                f"{r['kept_fp32']} fp32 | {r['layer_cosine_min']} | {r['layer_rel_err_median']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama")
    p.add_argument("--exporter", default="dynamo", choices=["dynamo", "torchscript"])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--no-minilm", dest="minilm", action="store_false")
    p.add_argument(
        "--no-torch", dest="torch", action="store_false", help="without the drop-in module rows"
    )
    p.add_argument("--out", default=str(RESULTS / "compressed_weights"), help="path stem")
    args = p.parse_args(argv)
    from peers import write_results

    print(write_results(args.out, run(args), markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

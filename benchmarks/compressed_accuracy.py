"""Accuracy of compressed weights (issue 22): what fp16 / int8 / int4 weights cost in quality.

Run: ``.venv/bin/python benchmarks/compressed_accuracy.py [--out DIR] [--forms fp16,int8,int4]
[--policies default,all] [--kernels auto,GemvQ,timed,size] [--tokens N]`` (``--render`` rewrites the .md from the .json; timing-free but for ``timed`` and ``size`` rows: elsewhere safe mode's speed checks are off). Writes
``benchmarks/results/compressed_accuracy.json`` and ``compressed_accuracy.md``.

Models, both through the ONNX route ``GraphAutoFusion(export, options=FuseOptions(weights=f,
check_speed=False)).fuse()`` then ``save()``, each saved file run in onnxruntime
(``ort_session(..., "all", threads=2)``):

* the **trained test LM** (``testing/trained_lm.py``: a byte-level Llama, hidden 256, 4 layers,
  trained on the standard library's source), its no-cache logits export: held-out perplexity
  (``--tokens`` bytes of files never trained on, windows of 128, teacher forced) and its
  relative change against the fp32 export, top-1 agreement of the teacher-forced next-token
  predictions with fp32, the lowest logits cosine, how many contractions were compressed and
  kept fp32 (with the reasons), and the file sizes. Safe mode's sample input is 128 bytes of a
  *training* file, so the check never sees the held-out text.
* **MiniLM** (all-MiniLM-L6-v2, real weights): cosine of the mean-pooled sentence embeddings
  of :data:`SENTENCES` (padded to 32 tokens) against the fp32 export's, and file sizes.

``fp32`` rows are ``weights="fp32"`` (the default: our fusions alone, no weight compression);
a row ``int8`` is ``weights_policy="default"`` (the LM head and the embedding tables at a higher
precision: fp16 in an int8 model, the head int8 and the tables fp16 in an int4 one, fp32 in an
fp16 one), ``int8/all`` is
``weights_policy="all"`` (they are compressed too, each verified). int8/int4 rows run on
onnxruntime's ``MatMulNBits`` (what an untimed fuse picks); a row ``int8+GemvQ`` is
``weights_kernel="GemvQ"``: our kernel on the same quantized weights, its activations kept to
1/64516 of their block's largest where ``MatMulNBits`` (``accuracy_level`` 4) rounds them to
int8 (``--kernels``).
Goals (issue 22): perplexity within +1% (int8) / +5% (int4); top-1 >= 98% (int8) / >= 93%
(int4); MiniLM cosine >= 0.999 (int8); the int8 file at most 0.3x the fp32 export.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

OUT = ROOT / "benchmarks" / "results"
WINDOW = 128
GOALS = {
    "int8": {"ppl_rel": 0.01, "top1": 0.98, "cosine": 0.999, "size": 0.3},
    "int4": {"ppl_rel": 0.05, "top1": 0.93},
}

#: MiniLM check sentences: the zoo's four, then short and long ones of other kinds.
SENTENCES_EXTRA = (
    "How do I reverse a list in Python without copying it?",
    "The committee postponed the vote until the budget report is published next week.",
    "Fresh bread and strong coffee are the best start to a cold morning.",
    "Quantized weights trade a little accuracy for much less memory traffic.",
    "She played the cello in an orchestra for twenty years before she retired.",
    "Error: file not found.",
    "A small boat drifted slowly across the calm lake at sunset.",
    "Matrix multiplication dominates the cost of transformer inference on CPUs.",
    "The museum reopened after a two-year renovation of its east wing.",
    "Please restart the server after updating the configuration file.",
    "Penguins cannot fly, but they are excellent swimmers.",
    "The stock market fell sharply after the central bank raised interest rates.",
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _variants(
    forms: list[str], policies: list[str], kernels: list[str] = ("auto",)
) -> list[tuple[str, str, str, str]]:
    """``(row label, form, policy, kernel)``: fp32, then every form under every policy (the
    label of the ``default`` policy is the form alone, of another ``form/policy``), int8/int4
    on every ``FuseOptions.weights_kernel`` of ``kernels`` (``auto``, untimed, is
    ``MatMulNBits``; another kernel's label ends ``+kernel``)."""
    rows = [("fp32", "fp32", "default", "auto")]
    for policy in policies:
        for f in forms:
            base = f if policy == "default" else f"{f}/{policy}"
            for k in kernels if f in ("int8", "int4") else ("auto",):
                rows.append((base if k == "auto" else f"{base}+{k}", f, policy, k))
    return rows


def fuse_save(
    path: Path,
    form: str,
    policy: str,
    feeds: dict[str, np.ndarray],
    dest: Path,
    kernel: str = "auto",
) -> dict[str, Any]:
    """Fuse ``path`` with ``weights=form`` under ``policy`` on ``kernel`` (safe mode on, no
    timing; ``timed``: safe mode's speed checks on, its race choosing each layer's kernel, as a
    default ``fuse()`` does; ``size``: the same with ``weights_goal="size"``) and save it to
    ``dest``."""
    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.options import FuseOptions

    t = time.perf_counter()
    kw: dict[str, str] = {"weights_policy": policy} if policy != "default" else {}
    if kernel not in ("auto", "timed", "size"):
        kw["weights_kernel"] = kernel
    if kernel == "size":
        kw["weights_goal"] = "size"
    opts = FuseOptions(weights=form, check_speed=kernel in ("timed", "size"), **kw)
    gaf = GraphAutoFusion(str(path), options=opts, sample_inputs=feeds)
    gaf.fuse()
    gaf.save(dest)
    info: dict[str, Any] = {
        "form": form,
        "policy": policy,
        "kernel": kernel,
        "fuse_s": round(time.perf_counter() - t, 2),
        "bytes": dest.stat().st_size,
    }
    report = getattr(gaf.result, "weights", None)
    if report is not None:
        d = report.to_dict()
        kept = [r for r in d["layers"] if r["form"] == "fp32"]
        keys = ("name", "k", "n", "form", "kernel", "block_size", "cosine", "rel_err", "reason")
        info.update(
            compressed=d["compressed"],
            kept_fp32=d["kept_fp32"],
            kept_reasons=sorted({r.get("reason", "") for r in kept} - {""}),
            verified=d.get("verified"),
            end_to_end=d.get("end_to_end"),
            notes=d.get("notes", []),
            layers=[{k: r.get(k) for k in keys} for r in d["layers"]],
            on_gemvq=sum(r.get("kernel") == "GemvQ" for r in d["layers"]),
        )
    return info


def trained_lm_rows(
    variants: list[tuple[str, str, str, str]], tokens: int, work: Path
) -> dict[str, Any]:
    from graph_autofusion.testing.trained_lm import (
        export_trained_lm,
        heldout_tokens,
        train_tokens,
        trained_lm,
        trained_lm_info,
    )
    from graph_autofusion.verify.lm_metrics import (
        compare_lm,
        ort_logits_runner,
        perplexity,
        torch_logits_runner,
    )

    log("trained LM: weights and export")
    path = export_trained_lm("logits")
    held = heldout_tokens(tokens)
    sample = train_tokens(WINDOW)[None]
    feeds = {"input_ids": sample, "attention_mask": np.ones_like(sample)}
    ref = ort_logits_runner(path)
    info = trained_lm_info()
    out: dict[str, Any] = {
        "export": path.name,
        "export_bytes": path.stat().st_size,
        "params": info["params"],
        "train": {k: info[k] for k in ("train_seconds", "first_loss", "final_loss", "recipe")},
        "heldout_tokens": int(held.size),
        "window": WINDOW,
        "ppl_fp32_torch": perplexity(torch_logits_runner(trained_lm()[0]), held, WINDOW),
        "uniform_ppl": 256,
        "rows": {},
    }
    for label, form, policy, kernel in variants:
        log(f"trained LM: {label}")
        dest = work / f"trained_lm-{form}-{policy}-{kernel}.onnx"
        row = fuse_save(path, form, policy, feeds, dest, kernel)
        row.update(compare_lm(ref, ort_logits_runner(dest), held, WINDOW))
        row["size_vs_fp32"] = row["bytes"] / out["export_bytes"]
        out["rows"][label] = row
        log(
            f"  ppl {row['ppl_test']:.4f} ({100 * row['ppl_rel_change']:+.3f}%), top-1 "
            f"{100 * row['top1_agreement']:.2f}%, size {row['size_vs_fp32']:.3f}x"
        )
    return out


def minilm_rows(variants: list[tuple[str, str, str, str]], work: Path) -> dict[str, Any]:
    from graph_autofusion.testing.builders import minilm_tokenize
    from graph_autofusion.testing.export import (
        MINILM_CHECK_SENTENCES,
        export_onnx,
        minilm_onnx_embeddings,
    )
    from graph_autofusion.verify.lm_metrics import row_cosines

    sentences = MINILM_CHECK_SENTENCES + SENTENCES_EXTRA
    log("MiniLM: export")
    path = export_onnx("minilm")
    enc = minilm_tokenize(list(sentences), seq_len=32)
    feeds = {k: v.numpy() for k, v in enc.items()}
    ref = minilm_onnx_embeddings(path, sentences, seq_len=32)
    out: dict[str, Any] = {
        "export": path.name,
        "export_bytes": path.stat().st_size,
        "sentences": len(sentences),
        "seq_len": 32,
        "rows": {},
    }
    for label, form, policy, kernel in variants:
        log(f"MiniLM: {label}")
        dest = work / f"minilm-{form}-{policy}-{kernel}.onnx"
        row = fuse_save(path, form, policy, feeds, dest, kernel)
        cos = row_cosines(ref, minilm_onnx_embeddings(dest, sentences, seq_len=32))
        row.update(min_cosine=float(cos.min()), mean_cosine=float(cos.mean()))
        row["size_vs_fp32"] = row["bytes"] / out["export_bytes"]
        out["rows"][label] = row
        log(f"  cosine min {row['min_cosine']:.6f}, size {row['size_vs_fp32']:.3f}x")
    return out


def _kept_summary(rows: dict[str, Any]) -> list[str]:
    """Per form, the kept-fp32 layers counted by reason (the reason up to its details)."""
    out = []
    for form, r in rows.items():
        counts: dict[str, int] = {}
        for layer in r.get("layers", []):
            if layer["form"] == "fp32" and layer.get("reason"):
                why = layer["reason"].removeprefix("kept fp32: ").split(" (")[0]
                counts[why] = counts.get(why, 0) + 1
        if counts:
            parts = "; ".join(f"{n} {why}" for why, n in counts.items())
            out.append(f"\n{form}, kept fp32: {parts}.")
    return out


def _goal(form: str, key: str, value: float) -> str:
    goal = GOALS.get(form, {}).get(key)
    if goal is None:
        return ""
    ok = value <= goal if key in ("ppl_rel", "size") else value >= goal
    return " ✓" if ok else " ✗"


def _layers(r: dict[str, Any]) -> str:
    """The row's "compressed / kept fp32" (and, timed, how many layers safe mode put on
    ``GemvQ``)."""
    if "compressed" not in r:
        return "-"
    timed = f" (GemvQ {r['on_gemvq']})" if r.get("kernel") in ("timed", "size") else ""
    return f"{r['compressed']} / {r['kept_fp32']}{timed}"


def markdown(data: dict[str, Any]) -> str:
    env, lm, ml = data["environment"], data["trained_lm"], data["minilm"]
    lines = [
        "# Compressed weights: accuracy (issue 22)",
        "",
        f"Generated by `benchmarks/compressed_accuracy.py` ({env['date']}, commit {env['commit']}"
        f"{' dirty' if env['dirty'] else ''}). CPU: {env['cpu']} (ISA "
        f"{', '.join(env['isa']) or 'none of the listed'}); onnxruntime {env['onnxruntime']}, "
        f"torch {env['torch']}. Timing-free: the route fuses with safe mode on and "
        "`check_speed=False` (rows `+timed`: `check_speed` on, as a default `fuse()`: safe "
        "mode times each layer's kernel, the layers on `GemvQ` counted; `+size`: the same "
        "with `weights_goal='size'`); every model runs in "
        "onnxruntime ALL, 2 threads. ✓/✗: the "
        "issue's goal (ppl +1% int8 / +5% int4, top-1 >= 98% / 93%, MiniLM cosine >= 0.999 "
        "int8, int8 file <= 0.3x).",
        "",
        f"## Trained test LM ({lm['params'] / 1e6:.2f} M parameters, byte-level Llama)",
        "",
        f"Held-out perplexity: {lm['heldout_tokens']} bytes of standard-library files never "
        f"trained on, windows of {lm['window']}, teacher forced. fp32 (torch): "
        f"{lm['ppl_fp32_torch']:.3f}; uniform over bytes: {lm['uniform_ppl']}. Trained in "
        f"{lm['train']['train_seconds']} s wall on the machine that built the cache "
        f"(loss {lm['train']['first_loss']} -> {lm['train']['final_loss']}).",
        "",
        "| weights | perplexity | vs fp32 export | top-1 vs fp32 | min logits cosine "
        "| layers compressed / kept fp32 | file | vs fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in lm["rows"].items():
        form = r.get("form", label)
        layers = _layers(r)
        lines.append(
            f"| {label} | {r['ppl_test']:.4f} | {100 * r['ppl_rel_change']:+.3f}%"
            f"{_goal(form, 'ppl_rel', r['ppl_rel_change'])} | {100 * r['top1_agreement']:.2f}%"
            f"{_goal(form, 'top1', r['top1_agreement'])} | {r['min_logits_cosine']:.6f} | "
            f"{layers} | {r['bytes'] / 1e6:.2f} MB | {r['size_vs_fp32']:.3f}x"
            f"{_goal(form, 'size', r['size_vs_fp32'])} |"
        )
    lines.append(f"\nfp32 export: {lm['export_bytes'] / 1e6:.2f} MB.")
    lines += _kept_summary(lm["rows"])
    lines.append(
        f"\nCaveat: after its {lm['train']['recipe']['steps']} steps the test LM's weights have "
        "moved from their initialization by more than their own norm but stay near Gaussian "
        "(max |w| 3.9-6.4 standard deviations per matrix, 4.1-5.2 at initialization): none of "
        "the outlier features that make round-to-nearest hard on larger, longer-trained "
        "models. MiniLM's real weights are the harder case below."
    )
    lines += [
        "",
        f"## MiniLM (all-MiniLM-L6-v2, real weights): {ml['sentences']} sentences, "
        f"{ml['seq_len']} tokens",
        "",
        "| weights | min cosine | mean cosine | layers compressed / kept fp32 | file | vs fp32 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, r in ml["rows"].items():
        form = r.get("form", label)
        layers = _layers(r)
        lines.append(
            f"| {label} | {r['min_cosine']:.6f}{_goal(form, 'cosine', r['min_cosine'])} | "
            f"{r['mean_cosine']:.6f} | {layers} | {r['bytes'] / 1e6:.2f} MB | "
            f"{r['size_vs_fp32']:.3f}x |"
        )
    lines.append(f"\nfp32 export: {ml['export_bytes'] / 1e6:.2f} MB.")
    lines += _kept_summary(ml["rows"])
    return "\n".join(lines) + "\n"


def environment() -> dict[str, Any]:
    import onnxruntime
    import torch
    from torch_e2e_engines import machine

    env = machine()
    env.update(onnxruntime=onnxruntime.__version__, torch=torch.__version__)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", default="fp16,int8,int4", help="weight forms besides fp32")
    ap.add_argument(
        "--policies", default="default,all", help="FuseOptions.weights_policy values (rows each)"
    )
    ap.add_argument(
        "--kernels",
        default="auto,GemvQ",
        help="FuseOptions.weights_kernel values for the int8/int4 rows (auto: MatMulNBits, "
        "untimed; GemvQ: our kernel, rows labelled +GemvQ; timed: check_speed on, safe mode "
        "times GemvQ against MatMulNBits per layer as a default fuse() does, rows +timed; "
        "size: timed with weights_goal='size', rows +size)",
    )
    ap.add_argument("--tokens", type=int, default=8192, help="held-out bytes (trained LM)")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    ap.add_argument(
        "--out",
        type=Path,
        default=OUT,
        help="results folder (another machine's results in a folder of their own, e.g. "
        "benchmarks/results/epyc)",
    )
    args = ap.parse_args()
    out = args.out
    if args.render:
        data = json.loads((out / "compressed_accuracy.json").read_text())
        (out / "compressed_accuracy.md").write_text(markdown(data))
        return
    forms = [f for f in args.forms.split(",") if f]
    from graph_autofusion.options import FuseOptions

    if "weights" not in FuseOptions.__dataclass_fields__:
        sys.exit("FuseOptions has no `weights` option yet (issue 22's compressed weights)")
    policies = [p for p in args.policies.split(",") if p]
    if "weights_policy" not in FuseOptions.__dataclass_fields__:
        policies = ["default"]
    kernels = [k for k in args.kernels.split(",") if k]
    if "weights_kernel" not in FuseOptions.__dataclass_fields__:
        kernels = ["auto"]
    variants = _variants(forms, policies, kernels)
    data: dict[str, Any] = {"environment": environment(), "command": " ".join(sys.argv[1:])}
    with tempfile.TemporaryDirectory(prefix="compressed_accuracy-") as tmp:
        data["trained_lm"] = trained_lm_rows(variants, args.tokens, Path(tmp))
        data["minilm"] = minilm_rows(variants, Path(tmp))
    out.mkdir(parents=True, exist_ok=True)
    (out / "compressed_accuracy.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "compressed_accuracy.md").write_text(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()

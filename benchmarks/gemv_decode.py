"""The few-row MatMul lowering end to end on the zoo Llama decoder (dynamo export): prefill (128
tokens) and greedy-decode ms/token of original, ours, ours+kernels (``fuse(custom_ops=True)``,
safe mode keeps the Gemv sites its timing finds not slower) and ours+kernels with every Gemv
site kept (``check_speed=False``: safe mode's numerics only), interleaved round-robin, settings
of ``benchmarks/vs_ort_decode.py``. Writes ``benchmarks/results/gemv_decode.json``.

    .venv/bin/python benchmarks/gemv_decode.py       # ~2 min
"""

# ruff: noqa: E401, E402, E501, E702, I001
import os, sys, tempfile, time, statistics, json, numpy as np
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from vs_ort_decode import decode_feeds, SAMPLE_PAST, PROMPT
from peers import timed_session
from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.runtime.ort_session import fused_session
from graph_autofusion.testing.kv_cache import export_decoder, greedy_decode_ort, empty_past


def main() -> None:
    name = "llama"
    path = str(export_decoder(name, "dynamo"))
    d = tempfile.mkdtemp(prefix="gaf_gemv_decode_")
    paths = {"original": path}
    kept = {}
    load_start = os.getloadavg()
    for v, kw in [
        ("ours", {}),
        ("ours+kernels", {"custom_ops": True}),
        ("ours+kernels,all-gemv", {"custom_ops": True, "check_speed": False}),
    ]:
        gaf = GraphAutoFusion(path, preset="llm", sample_inputs=decode_feeds(name, SAMPLE_PAST))
        gaf.fuse(**kw)
        out = f"{d}/{v.replace('+', '_').replace(',', '_')}.onnx"
        gaf.save(out)
        paths[v] = out
        kept[v] = sum(1 for low in gaf.result.lowered if low.rule == "gemv_matmul")
        print(v, "gemv kept:", kept[v], flush=True)
    sess = {
        k: (
            fused_session(p, "all", 2, denormals="keep")
            if "kernels" in k
            else timed_session(p, "all")
        )
        for k, p in paths.items()
    }
    names = list(sess)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 1000, (1, PROMPT)).astype(np.int64)
    toks = {k: greedy_decode_ort(s, name, prompt, 50)[0] for k, s in sess.items()}
    print("tokens equal original:", {k: t == toks["original"] for k, t in toks.items()})
    pre = {
        "input_ids": rng.integers(0, 1000, (1, 128)).astype(np.int64),
        "attention_mask": np.ones((1, 128), np.int64),
        "position_ids": np.arange(128, dtype=np.int64)[None],
        **empty_past(name),
    }
    decl = {k: {i.name for i in s.get_inputs()} for k, s in sess.items()}
    pt = {k: [] for k in names}
    loops = {k: [] for k in names}
    for r in range(20):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            sess[k].run(None, {n: v for n, v in pre.items() if n in decl[k]})
            pt[k].append(time.perf_counter() - t)
    for r in range(7):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            loops[k].append(statistics.fmean(greedy_decode_ort(sess[k], name, prompt, 50)[1]) * 1e3)
    res = {
        k: {
            "prefill_ms": float(np.median(pt[k]) * 1e3),
            "decode_ms_per_token": float(np.median(loops[k])),
            "loops": loops[k],
        }
        for k in names
    }
    for k in kept:
        res[k]["gemv_sites_kept"] = kept[k]
    res["tokens_equal_original"] = {k: t == toks["original"] for k, t in toks.items()}
    res["load_start"], res["load_end"] = load_start, os.getloadavg()
    out = ROOT / "benchmarks" / "results" / "gemv_decode.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""The drop-in module's ``generate()`` on causal-LM families no issue names.

Run: ``.venv/bin/python benchmarks/generate_sweep.py [FAMILY ...]`` (15-25 s per family;
writes ``benchmarks/results/generate_sweep.{json,md}`` and prints the table).

Each family is built from a config (2 layers, hidden 64-128, vocabulary 1000, random weights,
``torch.manual_seed(0)``), fused with ``GraphAutoFusion(model).fuse(check_speed=False)`` and
asked for 20 greedy tokens three times (prompts of 12 tokens with a mask, 7 without, 12 with),
against eager ``generate()`` with the same arguments. Recorded: whether the tokens are eager's,
how many calls and tokens the decode loop (``graph_autofusion/torch_decode.py``) served and why
it did not when it did not, the compiled graphs and those in eager, and the seconds taken.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import transformers

from graph_autofusion import GraphAutoFusion
from graph_autofusion.runtime.peer_engines import cpu_facts
from graph_autofusion.testing.small_hf import SMALL_HF, tiny_causal_lm, tiny_llama

RESULTS = Path(__file__).resolve().parent / "results"
PROMPTS = ((12, 1, True), (7, 2, False), (12, 3, True))  # length, seed, attention mask given


FAMILIES = {
    "llama": lambda: tiny_llama(),
    "qwen2": lambda: SMALL_HF["qwen2"]()[0].eval(),
    "gemma": lambda: SMALL_HF["gemma"]()[0].eval(),
    "phi": lambda: SMALL_HF["phi"]()[0].eval(),
    "gpt_neox": lambda: SMALL_HF["gpt_neox"]()[0].eval(),
    "gpt2": lambda: tiny_causal_lm(
        "GPT2Config", "GPT2LMHeadModel", n_embd=128, n_layer=2, n_head=4, n_positions=256
    ),
    "mistral": lambda: tiny_causal_lm("MistralConfig", "MistralForCausalLM", num_key_value_heads=2),
    "opt": lambda: tiny_causal_lm(
        "OPTConfig",
        "OPTForCausalLM",
        ffn_dim=256,
        max_position_embeddings=256,
        word_embed_proj_dim=128,
    ),
    "bloom": lambda: tiny_causal_lm("BloomConfig", "BloomForCausalLM", n_layer=2, n_head=4),
    "falcon": lambda: tiny_causal_lm("FalconConfig", "FalconForCausalLM"),
    "stablelm": lambda: tiny_causal_lm(
        "StableLmConfig", "StableLmForCausalLM", num_key_value_heads=4
    ),
    "gemma2": lambda: tiny_causal_lm(
        "Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=2, head_dim=32
    ),
    "olmo": lambda: tiny_causal_lm("OlmoConfig", "OlmoForCausalLM"),
}


def run(name: str) -> dict:
    torch._dynamo.reset()
    t = time.perf_counter()
    try:
        model = FAMILIES[name]()
        fused = GraphAutoFusion(model).fuse(check_speed=False)
        same = []
        for n, seed, mask in PROMPTS:
            ids = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(seed))
            kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None)
            if mask:
                kw["attention_mask"] = torch.ones_like(ids)
            with torch.no_grad():
                want = model.generate(ids, **kw)
            same.append(bool(torch.equal(fused.generate(ids, **kw), want)))
    except Exception as exc:  # noqa: BLE001 - recorded as the family's result
        return {"family": name, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
    d, graphs = fused.autofusion.decode, fused.autofusion.graphs
    return {
        "family": name,
        "same_tokens": same,
        "loop_calls": d.loop_calls,
        "generate_calls": d.calls,
        "loop_tokens": d.loop_tokens,
        "reason": d.last_reason,
        "graphs": len(graphs),
        "eager_graphs": [g.index for g in graphs if g.fallback],
        "seconds": round(time.perf_counter() - t, 1),
    }


def main() -> None:
    torch.set_num_threads(2)
    names = sys.argv[1:] or list(FAMILIES)
    rows = []
    for name in names:
        rows.append(run(name))
        print(json.dumps(rows[-1]), flush=True)
    data = {"cpu": cpu_facts(), "torch": torch.__version__, "rows": rows}
    data["transformers"] = transformers.__version__
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "generate_sweep.json").write_text(json.dumps(data, indent=2) + "\n")
    text = markdown(data)
    (RESULTS / "generate_sweep.md").write_text(text)
    print(text)


def markdown(data: dict) -> str:
    cpu = data["cpu"]
    lines = [
        "# The drop-in module's generate() on causal-LM families no issue names",
        "",
        f"CPU: {cpu.get('cpu')} ({', '.join(cpu.get('isa', []))}); torch {data['torch']}, "
        f"transformers {data['transformers']}; `benchmarks/generate_sweep.py`. 20 greedy "
        "tokens for each of three prompts (12 tokens with a mask, 7 without, 12 with) against "
        "eager.",
        "",
        "| family | eager's tokens | calls finished by the loop | loop tokens | graphs "
        "(in eager) | why not the loop | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['family']} | ERROR: {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['family']} | {sum(r['same_tokens'])}/{len(r['same_tokens'])} | "
            f"{r['loop_calls']}/{r['generate_calls']} | {r['loop_tokens']} | {r['graphs']} "
            f"({len(r['eager_graphs'])}) | {r['reason'] or '-'} | {r['seconds']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

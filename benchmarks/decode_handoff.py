"""Greedy generate() across a sliding window: the decode loop's hand-off against none.

Run: ``.venv/bin/python benchmarks/decode_handoff.py [--rounds 7] [--out DIR]`` (about 3
minutes; writes ``decode_handoff.{json,md}`` under ``benchmarks/results/`` or ``DIR`` and
prints the table).

Sliding-window decoders (Mistral, Starcoder2, Gemma-3 text with sliding and full layers;
4 layers, hidden 256, random weights, a window of 64) generate 96 greedy tokens after a
16-token prompt, so the cache passes the window once. Configurations, in one process, timed
in rounds of a shuffled order after one untimed call each:

* ``eager``: the model's own ``generate()``;
* ``drop-in, no hand-off``: the fused module's ``generate()`` with
  ``torch_decode.MAX_HANDOFFS = 0`` (what it did before: Dynamo's guards refuse a later
  step, so Hugging Face's loop decodes every token through the compiled frame);
* ``drop-in, hand-off``: the default (the decode loop up to the window, Hugging Face's
  ``generate()`` across it, the loop again after it).

Every configuration's tokens are compared with eager's. Reported: ms per generated token
(median of the rounds, p10-p90), the ratio to eager and to the drop-in without hand-off, and
the tokens the loop decoded.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import numpy as np
import torch
import transformers
from peers import run_facts, write_results

from graph_autofusion import GraphAutoFusion, torch_decode
from graph_autofusion.runtime.timing import round_robin
from graph_autofusion.testing.small_hf import tiny_causal_lm

RESULTS = Path(__file__).resolve().parent / "results"
WINDOW, PROMPT, NEW = 64, 16, 96
SIZE = dict(
    vocab_size=1000,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(sliding_window=WINDOW)),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            sliding_window=WINDOW,
            head_dim=32,
            layer_types=["sliding_attention", "sliding_attention", "sliding_attention"]
            + ["full_attention"],
        ),
    ),
}
CONFIGS = ("eager", "drop-in, no hand-off", "drop-in, hand-off")


def run(name: str, rounds: int) -> dict:
    torch._dynamo.reset()
    config_cls, model_cls, extra = FAMILIES[name]
    model = tiny_causal_lm(config_cls, model_cls, **SIZE, **extra)
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    ids = torch.randint(3, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    kw = dict(
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    stats = fused.autofusion.decode

    def call(cfg: str) -> torch.Tensor:
        if cfg == "eager":
            return model.generate(ids, **kw)
        saved = torch_decode.MAX_HANDOFFS
        torch_decode.MAX_HANDOFFS = 0 if cfg == "drop-in, no hand-off" else saved
        try:
            return fused.generate(ids, **kw)
        finally:
            torch_decode.MAX_HANDOFFS = saved

    same: dict[str, bool] = {}
    loop_tokens: dict[str, int] = {}
    with torch.no_grad():
        want = call("eager")
        for cfg in CONFIGS:  # untimed: compiles every variant, checks the tokens
            before = stats.loop_tokens
            same[cfg] = bool(torch.equal(call(cfg), want))
            loop_tokens[cfg] = stats.loop_tokens - before
        fns = {cfg: functools.partial(call, cfg) for cfg in CONFIGS}
        seconds = round_robin(fns, rounds, warmup=0, rotate=True)
    times = {c: [t * 1e3 / NEW for t in v] for c, v in seconds.items()}
    med = {c: statistics.median(v) for c, v in times.items()}
    return {
        "family": name,
        "ms_per_token": med,
        "p10_p90": {c: np.percentile(v, [10, 90]).tolist() for c, v in times.items()},
        "same_tokens": same,
        "loop_tokens": loop_tokens,
        "handoffs": stats.handoffs,
        "vs_eager": {c: med[c] / med["eager"] for c in CONFIGS},
        "vs_no_handoff": med["drop-in, hand-off"] / med["drop-in, no hand-off"],
    }


def markdown(data: dict) -> str:
    cpu = data["machine"]
    lines = [
        "# Greedy generate() across a sliding window: the decode loop's hand-off",
        "",
        f"CPU: {cpu.get('cpu')} ({', '.join(cpu.get('isa', []))}), 2 threads; torch "
        f"{data['torch']}, transformers {data['transformers']}; {data['date']}, commit "
        f"{data['commit']}; `benchmarks/decode_handoff.py`.",
        f"{WINDOW}-token window, {PROMPT}-token prompt, {NEW} new tokens (the cache passes the "
        f"window once); 4 layers, hidden 256, random weights. ms per generated token, median "
        f"of {data['rounds']} rounds in a shuffled order (p10-p90).",
        "",
        "| family | configuration | ms/token | vs eager | eager's tokens | loop tokens |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        for c in CONFIGS:
            lo, hi = r["p10_p90"][c]
            lines.append(
                f"| {r['family']} | {c} | {r['ms_per_token'][c]:.2f} ({lo:.2f}-{hi:.2f}) | "
                f"{r['vs_eager'][c]:.2f}x | {r['same_tokens'][c]} | {r['loop_tokens'][c]} |"
            )
    lines.append("")
    for r in data["rows"]:
        lines.append(
            f"- {r['family']}: hand-off / no hand-off {r['vs_no_handoff']:.3f}; "
            f"{r['handoffs']} hand-offs over the run"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("families", nargs="*", default=list(FAMILIES))
    a = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    for name in a.families:
        rows.append(run(name, a.rounds))
        print(json.dumps(rows[-1]), flush=True)
    data = {
        **run_facts(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "rounds": a.rounds,
        "rows": rows,
    }
    print(write_results(a.out / "decode_handoff", data, markdown))


if __name__ == "__main__":
    main()

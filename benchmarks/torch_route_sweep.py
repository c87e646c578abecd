"""A held-out architecture sweep of the PyTorch route, for correctness and robustness (not speed).

Run: ``nice -n 10 .venv/bin/python benchmarks/torch_route_sweep.py [--models qwen2,mlp]
[--timeout 900]`` (about 20-40 min for every model on two shared cores; each model runs in
its own subprocess with a timeout, so one crash or hang does not stop the sweep). Writes
``benchmarks/results/torch_route_sweep.json`` and ``.md``; ``--merge`` reruns the models named
and keeps the file's other rows (each row records the commit it ran at).

Models: the unseen-architecture set of :mod:`graph_autofusion.testing.small_hf`
(``SMALL_HF``), tiny Llama, more Hugging Face families built from configs with random weights
(Mistral, Phi3, Gemma2, Qwen2-MoE, Mixtral, Falcon, OPT, BLOOM, GPT-2, RoBERTa, ALBERT,
Segformer with its decode head) and plain torch modules (a CNN with BatchNorm and a residual,
an MLP, a GRU, an LSTM, a small UNet with interpolate). No hub download.

For each model, with ``torch._dynamo.reset()`` first:

* ``torch.compile(model, backend="autofusion")`` (the registered backend, its defaults: safe
  mode, speed checks, engine chosen on the first call) called under ``torch.no_grad()`` with
  three sequence lengths (8, 13, 21; the third call's attention mask, where the model takes
  one, has its last 3 positions 0), or one image size called twice (different data); every
  tensor of the output (logits, hidden states, the KV cache) compared with eager's;
* causal LMs also: ``GraphAutoFusion(model).fuse().generate(ids, max_new_tokens=10,
  do_sample=False)`` against eager's ``generate`` (same tokens?), after another
  ``torch._dynamo.reset()``.

Recorded per model: per call the worst cosine, max abs and relative L2 difference over the
outputs (integer outputs: equal or not); each compiled graph's ``summary()`` (engine,
``engine_ms``, ``engine_notes``: why onnxruntime or torch could not be built, ``fallback``: why
the graph runs in eager); every ``AutofusionWarning`` text; any exception escaping the user's
call (type, message, last frames); the backend's compile seconds and the first call's wall
time. A model is ``correct`` when every float output has cosine >= 0.9999 and relative error
<= 2e-3 against eager (the backend's own fp32 floor is 1e-3), every integer output is equal,
the generated tokens are equal, and no exception escaped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "torch_route_sweep.json"
LENGTHS = (8, 13, 21)
COS_FLOOR = 0.9999
REL_CEIL = 2e-3
GEN_TOKENS = 10


# ------------------------------------------------------------------------------- the models
def _torch():
    import torch

    return torch


def _seq_inputs(names: tuple[str, ...], vocab: int = 1000):
    """Inputs of a token model: ids (and a mask of ones, its last 3 positions 0 on the third
    call) of length ``n``."""

    def make(n: int, call: int) -> dict:
        torch = _torch()
        g = torch.Generator().manual_seed(100 + n)
        ids = torch.randint(0, vocab, (1, n), generator=g)
        out = {"input_ids": ids}
        if "attention_mask" in names:
            mask = torch.ones(1, n, dtype=torch.long)
            if call == 2:
                mask[:, -3:] = 0
            out["attention_mask"] = mask
        return out

    return make


def _image_inputs(size: int, chans: int = 3, key: str = "pixel_values"):
    def make(n: int, call: int) -> dict:
        torch = _torch()
        g = torch.Generator().manual_seed(200 + call)
        return {key: torch.randn(1, chans, size, size, generator=g)}

    return make


def _hf(config_cls: str, model_cls: str, **cfg: Any) -> Callable[[], Any]:
    def build():
        import transformers

        config = getattr(transformers, config_cls)(**cfg)
        return getattr(transformers, model_cls)(config)

    return build


_LLM = dict(
    vocab_size=1000,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
)
_BERT = dict(
    vocab_size=1000,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=256,
    max_position_embeddings=64,
)


def _small_hf(name: str) -> Callable[[], Any]:
    def build():
        from graph_autofusion.testing.small_hf import SMALL_HF

        model, _inputs = SMALL_HF[name]()
        return model

    return build


def _llama():
    from graph_autofusion.testing.small_hf import tiny_llama

    return tiny_llama(2)


# plain torch modules (defined lazily: torch is imported only in the workers)
def _plain(kind: str) -> Callable[[], Any]:
    def build():
        torch = _torch()
        nn, F = torch.nn, torch.nn.functional

        class CnnBnResidual(nn.Module):
            def __init__(self):
                super().__init__()
                self.stem = nn.Sequential(
                    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()
                )
                self.c1 = nn.Conv2d(16, 16, 3, padding=1)
                self.b1 = nn.BatchNorm2d(16)
                self.c2 = nn.Conv2d(16, 16, 3, padding=1)
                self.b2 = nn.BatchNorm2d(16)
                self.down = nn.Sequential(
                    nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU()
                )
                self.fc = nn.Linear(32, 10)

            def forward(self, x):
                h = self.stem(x)
                r = F.relu(self.b1(self.c1(h)))
                h = F.relu(h + self.b2(self.c2(r)))
                h = F.max_pool2d(self.down(h), 2)
                return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))

        class Mlp(nn.Module):
            def __init__(self):
                super().__init__()
                self.l1, self.l2, self.l3 = (
                    nn.Linear(32, 128),
                    nn.Linear(128, 128),
                    nn.Linear(128, 8),
                )
                self.norm = nn.LayerNorm(128)

            def forward(self, x):
                h = F.gelu(self.l1(x))
                h = self.norm(h + torch.tanh(self.l2(h)))
                return torch.log_softmax(self.l3(h), -1)

        class Rnn(nn.Module):
            def __init__(self, cell: str):
                super().__init__()
                self.emb = nn.Embedding(100, 16)
                self.rnn = getattr(nn, cell)(16, 32, num_layers=2, batch_first=True)
                self.out = nn.Linear(32, 100)

            def forward(self, input_ids):
                h, _ = self.rnn(self.emb(input_ids))
                return self.out(torch.relu(h))

        class UNet(nn.Module):
            def __init__(self):
                super().__init__()

                def block(i, o):
                    return nn.Sequential(
                        nn.Conv2d(i, o, 3, padding=1),
                        nn.BatchNorm2d(o),
                        nn.ReLU(),
                        nn.Conv2d(o, o, 3, padding=1),
                        nn.ReLU(),
                    )

                self.e1, self.e2, self.mid = block(3, 8), block(8, 16), block(16, 32)
                self.d2, self.d1 = block(32 + 16, 16), block(16 + 8, 8)
                self.head = nn.Conv2d(8, 2, 1)

            def forward(self, x):
                a = self.e1(x)
                b = self.e2(F.max_pool2d(a, 2))
                m = self.mid(F.max_pool2d(b, 2))
                u = F.interpolate(m, scale_factor=2.0, mode="bilinear", align_corners=False)
                d = self.d2(torch.cat([u, b], 1))
                u = F.interpolate(d, size=a.shape[-2:], mode="nearest")
                return torch.sigmoid(self.head(self.d1(torch.cat([u, a], 1))))

        return {
            "cnn_bn_residual": CnnBnResidual,
            "mlp": Mlp,
            "gru": lambda: Rnn("GRU"),
            "lstm": lambda: Rnn("LSTM"),
            "unet_interp": UNet,
        }[kind]()

    return build


def _mlp_inputs(n: int, call: int) -> dict:
    torch = _torch()
    return {"x": torch.randn(n, 32, generator=torch.Generator().manual_seed(n))}


def _whisper_inputs(n: int, call: int) -> dict:
    torch = _torch()
    return {"input_features": torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(call))}


_IDS = ("input_ids",)
_IDS_MASK = ("input_ids", "attention_mask")

#: name -> (source, build, inputs(n, call), kind): kind ``causal`` (three lengths and
#: generate), ``seq`` (three lengths) or ``fixed`` (one size, two calls)
MODELS: dict[str, tuple[str, Callable[[], Any], Callable[[int, int], dict], str]] = {
    # graph_autofusion.testing.small_hf.SMALL_HF
    "qwen2": ("SMALL_HF", _small_hf("qwen2"), _seq_inputs(_IDS_MASK), "causal"),
    "gemma": ("SMALL_HF", _small_hf("gemma"), _seq_inputs(_IDS_MASK), "causal"),
    "phi": ("SMALL_HF", _small_hf("phi"), _seq_inputs(_IDS_MASK), "causal"),
    "gpt_neox": ("SMALL_HF", _small_hf("gpt_neox"), _seq_inputs(_IDS_MASK), "causal"),
    "distilbert": ("SMALL_HF", _small_hf("distilbert"), _seq_inputs(_IDS_MASK), "seq"),
    "deberta_v2": ("SMALL_HF", _small_hf("deberta_v2"), _seq_inputs(_IDS_MASK), "seq"),
    "t5_encoder": ("SMALL_HF", _small_hf("t5_encoder"), _seq_inputs(_IDS_MASK), "seq"),
    "bart": ("SMALL_HF", _small_hf("bart"), _seq_inputs(_IDS_MASK), "seq"),
    "whisper_encoder": ("SMALL_HF", _small_hf("whisper_encoder"), _whisper_inputs, "fixed"),
    "vit": ("SMALL_HF", _small_hf("vit"), _image_inputs(32), "fixed"),
    "convnext": ("SMALL_HF", _small_hf("convnext"), _image_inputs(32), "fixed"),
    "mobilenet_v2": ("SMALL_HF", _small_hf("mobilenet_v2"), _image_inputs(32), "fixed"),
    "swin": ("SMALL_HF", _small_hf("swin"), _image_inputs(32), "fixed"),
    # more Hugging Face families, from configs
    "llama": ("transformers", _llama, _seq_inputs(_IDS_MASK), "causal"),
    "mistral": (
        "transformers",
        _hf(
            "MistralConfig", "MistralForCausalLM", **_LLM, num_key_value_heads=2, sliding_window=16
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "phi3": (
        "transformers",
        _hf("Phi3Config", "Phi3ForCausalLM", **_LLM, num_key_value_heads=2, pad_token_id=0),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "gemma2": (
        "transformers",
        _hf(
            "Gemma2Config",
            "Gemma2ForCausalLM",
            **_LLM,
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=16,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "qwen2_moe": (
        "transformers",
        _hf(
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            **_LLM,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=128,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "mixtral": (
        "transformers",
        _hf(
            "MixtralConfig",
            "MixtralForCausalLM",
            **_LLM,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "phimoe": (
        "transformers",
        _hf(
            "PhimoeConfig",
            "PhimoeForCausalLM",
            **_LLM,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "olmoe": (
        "transformers",
        _hf(
            "OlmoeConfig",
            "OlmoeForCausalLM",
            **_LLM,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            pad_token_id=0,
            eos_token_id=2,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "deepseek_v3": (
        "transformers",
        _hf(
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            **_LLM,
            num_key_value_heads=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=0,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "mamba": (
        "transformers",
        _hf(
            "MambaConfig",
            "MambaForCausalLM",
            vocab_size=1000,
            hidden_size=128,
            num_hidden_layers=2,
            state_size=8,
        ),
        _seq_inputs(_IDS),
        "causal",
    ),
    "falcon": (
        "transformers",
        _hf(
            "FalconConfig",
            "FalconForCausalLM",
            vocab_size=1000,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "opt": (
        "transformers",
        _hf(
            "OPTConfig",
            "OPTForCausalLM",
            vocab_size=1000,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=64,
            max_position_embeddings=128,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "bloom": (
        "transformers",
        _hf(
            "BloomConfig", "BloomForCausalLM", vocab_size=1000, hidden_size=64, n_layer=2, n_head=4
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "gpt2": (
        "transformers",
        _hf(
            "GPT2Config",
            "GPT2LMHeadModel",
            vocab_size=1000,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=128,
        ),
        _seq_inputs(_IDS_MASK),
        "causal",
    ),
    "roberta": (
        "transformers",
        _hf("RobertaConfig", "RobertaModel", **_BERT, pad_token_id=1),
        _seq_inputs(_IDS_MASK),
        "seq",
    ),
    "albert": (
        "transformers",
        _hf("AlbertConfig", "AlbertModel", **_BERT, embedding_size=64),
        _seq_inputs(_IDS_MASK),
        "seq",
    ),
    "segformer": (
        "transformers",
        _hf(
            "SegformerConfig",
            "SegformerForSemanticSegmentation",
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=32,
            num_labels=3,
        ),
        _image_inputs(64),
        "fixed",
    ),
    # plain torch modules
    "cnn_bn_residual": ("torch", _plain("cnn_bn_residual"), _image_inputs(32, key="x"), "fixed"),
    "mlp": ("torch", _plain("mlp"), _mlp_inputs, "seq"),
    "gru": ("torch", _plain("gru"), _seq_inputs(_IDS, vocab=100), "seq"),
    "lstm": ("torch", _plain("lstm"), _seq_inputs(_IDS, vocab=100), "seq"),
    "unet_interp": ("torch", _plain("unet_interp"), _image_inputs(32, key="x"), "fixed"),
}


# ------------------------------------------------------------------------------- one model
def _tensors(out: Any) -> list[Any]:
    """Every tensor of a model output, in order (tuples, lists, dicts, model outputs, and a
    cache's per-layer keys and values)."""
    torch = _torch()
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # a ModelOutput is one
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, tuple | list):
        return [t for v in out for t in _tensors(v)]
    layers = getattr(out, "layers", None)  # a transformers Cache
    if isinstance(layers, list | tuple):
        return [
            t
            for layer in layers
            for a in ("keys", "values")
            for t in _tensors(getattr(layer, a, None))
        ]
    return []


def _compare(got: Any, want: Any) -> dict:
    torch = _torch()
    g, w = _tensors(got), _tensors(want)
    row: dict = {
        "outputs": len(w),
        "cosine": 1.0,
        "max_abs": 0.0,
        "rel": 0.0,
        "equal_ints": True,
        "problems": [],
    }
    if len(g) != len(w):
        row["problems"].append(f"{len(g)} output tensors, eager {len(w)}")
        return row
    for i, (a, b) in enumerate(zip(g, w)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            row["problems"].append(
                f"output {i}: {tuple(a.shape)} {a.dtype} vs eager {tuple(b.shape)} {b.dtype}"
            )
            continue
        if not b.dtype.is_floating_point:
            if not torch.equal(a, b):
                row["equal_ints"] = False
                row["problems"].append(f"output {i}: integers differ")
            continue
        if b.numel() == 0:
            continue
        a32, b32 = a.detach().double().flatten(), b.detach().double().flatten()
        if not (torch.isfinite(a32).all() and torch.isfinite(b32).all()):
            same = torch.equal(torch.isnan(a32), torch.isnan(b32))
            fin = torch.isfinite(a32) & torch.isfinite(b32)
            if not same:
                row["problems"].append(f"output {i}: NaN/inf pattern differs")
            a32, b32 = a32[fin], b32[fin]
            if a32.numel() == 0:
                continue
        diff = float((a32 - b32).abs().max())
        na, nb = float(a32.norm()), float(b32.norm())
        cos = 1.0 if na == nb == 0 else float(a32 @ b32) / max(na * nb, 1e-300)
        rel = float((a32 - b32).norm()) / max(nb, 1e-30)
        row["cosine"] = min(row["cosine"], cos)
        row["max_abs"] = max(row["max_abs"], diff)
        row["rel"] = max(row["rel"], rel)
    return row


def _call_ok(c: dict) -> bool:
    return (
        c.get("error") is None
        and not c["problems"]
        and c["cosine"] >= COS_FLOOR
        and c["rel"] <= REL_CEIL
        and c["equal_ints"]
    )


def _error(exc: BaseException) -> dict:
    tb = traceback.extract_tb(exc.__traceback__)
    return {
        "type": type(exc).__name__,
        "message": " ".join(str(exc).split())[:600],
        "frames": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb[-6:]],
    }


def run_one(name: str) -> dict:
    import torch

    from graph_autofusion.torch_compile import AutofusionWarning, default_graphs

    source, build, make_inputs, kind = MODELS[name]
    row: dict = {"model": name, "source": source, "kind": kind}
    torch.manual_seed(0)
    model = build().eval()
    if hasattr(model, "config") and hasattr(model.config, "_attn_implementation"):
        row["attn_implementation"] = model.config._attn_implementation
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="autofusion")
    calls = []
    plan = [(n, i) for i, n in enumerate(LENGTHS)] if kind != "fixed" else [(0, 0), (0, 1)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n, i in plan:
            inputs = make_inputs(n, i)
            c: dict = {"shape": {k: list(v.shape) for k, v in inputs.items()}}
            with torch.no_grad():
                want = model(**inputs)
                t = time.perf_counter()
                try:
                    got = compiled(**inputs)
                except Exception as exc:  # noqa: BLE001 - recorded: it escaped the user's call
                    c.update(
                        error=_error(exc),
                        problems=[],
                        cosine=None,
                        max_abs=None,
                        rel=None,
                        equal_ints=None,
                    )
                    c["wall_s"] = round(time.perf_counter() - t, 3)
                    calls.append(c)
                    continue
                c["wall_s"] = round(time.perf_counter() - t, 3)
            c.update(_compare(got, want))
            c["ok"] = _call_ok(c)
            calls.append(c)
    row["calls"] = calls
    graphs = default_graphs()
    row["graphs"] = [g.summary() for g in graphs]
    row["compile_seconds"] = round(sum(g.compile_seconds for g in graphs), 2)
    row["warnings"] = _autofusion_warnings(caught, AutofusionWarning)
    row["forward_ok"] = all(c.get("ok") for c in calls)
    if kind == "causal":
        row["generate"] = _generate(model, make_inputs, AutofusionWarning)
    row["correct"] = row["forward_ok"] and row.get("generate", {}).get("ok", True)
    return row


def _autofusion_warnings(caught: list, category: type) -> list[str]:
    seen: list[str] = []
    for w in caught:
        if issubclass(w.category, category):
            text = " ".join(str(w.message).split())[:400]
            if text not in seen:
                seen.append(text)
    return seen


def _generate(model: Any, make_inputs: Callable[[int, int], dict], category: type) -> dict:
    import torch

    from graph_autofusion import GraphAutoFusion

    ids = make_inputs(LENGTHS[0], 0)["input_ids"]
    kw = dict(max_new_tokens=GEN_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    out: dict = {"prompt": list(ids.shape)}
    with torch.no_grad():
        want = model.generate(ids, **kw)
    torch._dynamo.reset()
    fused = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = time.perf_counter()
        try:
            fused = GraphAutoFusion(model).fuse()
            out["fuse_s"] = round(time.perf_counter() - t, 2)
            t = time.perf_counter()
            with torch.no_grad():
                got = fused.generate(ids, **kw)
            out["generate_s"] = round(time.perf_counter() - t, 2)
            out["tokens_equal"] = bool(got.shape == want.shape and torch.equal(got, want))
            if not out["tokens_equal"]:
                out["want"] = want[0, ids.shape[1] :].tolist()
                out["got"] = got[0, ids.shape[1] :].tolist()
        except Exception as exc:  # noqa: BLE001 - recorded: it escaped the user's call
            out["error"] = _error(exc)
            out["tokens_equal"] = None
    if fused is not None and "autofusion" in fused.__dict__:
        graphs = fused.autofusion.graphs
        out["graphs"] = [g.summary() for g in graphs]
        out["compile_seconds"] = round(sum(g.compile_seconds for g in graphs), 2)
    out["warnings"] = _autofusion_warnings(caught, category)
    out["ok"] = bool(out.get("tokens_equal")) and "error" not in out
    return out


# ------------------------------------------------------------------------------- the sweep
def _worker(name: str, path: str) -> int:
    import logging

    logging.disable(logging.WARNING)
    try:
        row = run_one(name)
    except Exception as exc:  # noqa: BLE001 - building the model, or the sweep's own failure
        row = {
            "model": name,
            "source": MODELS[name][0],
            "kind": MODELS[name][3],
            "harness_error": _error(exc),
            "correct": False,
        }
    Path(path).write_text(json.dumps(row, indent=1, default=str))
    return 0


def _spawn(name: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="torch-sweep-") as d:
        path = os.path.join(d, "row.json")
        t = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--one", name, "--row", path],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            rc: int | str = proc.returncode
            tail = (proc.stdout + proc.stderr)[-1500:]
        except subprocess.TimeoutExpired as exc:
            rc, tail = "timeout", str((exc.stderr or b"")[-1500:])
        wall = round(time.perf_counter() - t, 1)
        if os.path.exists(path):
            row = json.loads(Path(path).read_text())
        else:
            source, _b, _i, kind = MODELS[name]
            row = {
                "model": name,
                "source": source,
                "kind": kind,
                "correct": False,
                "crash": {"returncode": rc, "tail": tail},
            }
        row["subprocess_wall_s"] = wall
        return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per model")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the other models' rows of --out (each row records its commit)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return _worker(args.one, args.row)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    out = Path(args.out)
    kept: list[dict] = []
    if args.merge and out.exists():
        kept = [r for r in json.loads(out.read_text())["rows"] if r["model"] not in names]
    rows: list[dict] = []
    start = time.perf_counter()
    commit = _commit()
    for name in names:
        row = _spawn(name, args.timeout)
        row["commit"] = commit
        rows.append(row)
        print(_line(row), flush=True)
        order = {n: k for k, n in enumerate(MODELS)}
        _write(out, sorted(kept + rows, key=lambda r: order.get(r["model"], 1 << 30)), start, argv)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def _versions() -> dict:
    import onnxruntime
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
    }


def _commit() -> str:
    """The checkout's commit (``SWEEP_COMMIT`` for a run from an exported snapshot)."""
    from peers import head_commit

    return os.environ.get("SWEEP_COMMIT") or head_commit()


def _write(out: Path, rows: list[dict], start: float, argv: list[str] | None) -> None:
    result = {
        "benchmark": "torch_route_sweep",
        "command": "python benchmarks/torch_route_sweep.py " + " ".join(argv or sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": ", ".join(dict.fromkeys(r.get("commit", "?") for r in rows)),
        "versions": _versions(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "criteria": {
            "cosine_floor": COS_FLOOR,
            "relative_error_ceiling": REL_CEIL,
            "lengths": list(LENGTHS),
            "generate_tokens": GEN_TOKENS,
        },
        "seconds": round(sum(r.get("subprocess_wall_s", 0.0) for r in rows), 1),
        "summary": {
            "models": len(rows),
            "correct": sum(bool(r.get("correct")) for r in rows),
            "graphs_in_eager": sum(1 for r in rows for g in _all_graphs(r) if g["fallback"]),
            "onnxruntime_refused": sum(
                1 for r in rows for g in _all_graphs(r) if "onnxruntime" in g["engine_notes"]
            ),
            "crashes": [r["model"] for r in rows if "crash" in r or "harness_error" in r],
        },
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(_markdown(result))


def _all_graphs(row: dict) -> list[dict]:
    return list(row.get("graphs", [])) + list(row.get("generate", {}).get("graphs", []))


def _engines(graphs: list[dict]) -> str:
    return " ".join(g["engine"][:4] or "?" for g in graphs) or "-"


def _worst(row: dict) -> str:
    calls = row.get("calls", [])
    if any(c.get("error") for c in calls):
        return "exception"
    cos = [c["cosine"] for c in calls if c.get("cosine") is not None]
    rel = [c["rel"] for c in calls if c.get("rel") is not None]
    if not cos:
        return "-"
    return f"{min(cos):.6f} / {max(rel):.1e}"


def _line(row: dict) -> str:
    if "crash" in row or "harness_error" in row:
        why = row.get("crash") or row.get("harness_error")
        return f"{row['model']:16s} CRASH {str(why)[:200]}"
    gen = row.get("generate", {})
    return (
        f"{row['model']:16s} graphs {len(row['graphs'])}+{len(gen.get('graphs', []))} "
        f"engines [{_engines(row['graphs'])}] [{_engines(gen.get('graphs', []))}] "
        f"worst {_worst(row)} tokens {gen.get('tokens_equal', '-')} "
        f"compile {row['compile_seconds']}+{gen.get('compile_seconds', 0)} s "
        f"{'ok' if row['correct'] else 'WRONG'} ({row['subprocess_wall_s']} s)"
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown(result: dict) -> str:
    rows = result["rows"]
    v = result["versions"]
    mixed = len({r.get("commit") for r in rows}) > 1  # a --merge of runs at several commits
    lines = [
        "# The PyTorch route on held-out architectures: correctness and robustness",
        "",
        f"Generated by `benchmarks/torch_route_sweep.py` ({result['created']}, commit "
        f"{result['commit']}; torch {v['torch']}, transformers {v['transformers']}, "
        f"onnxruntime {v['onnxruntime']}; {result['seconds']:.0f} s). Each model in its own "
        f'subprocess; `torch.compile(model, backend="autofusion")` (defaults: safe mode, speed '
        f"checks, the engine chosen on the first call) after `torch._dynamo.reset()`, called "
        f"under `torch.no_grad()` with lengths {', '.join(map(str, result['criteria']['lengths']))}"
        f" (the third call's mask has its last 3 positions 0) or one image size twice; causal "
        f"LMs also `GraphAutoFusion(model).fuse().generate(ids, max_new_tokens="
        f"{result['criteria']['generate_tokens']}, do_sample=False)` against eager's.",
        "",
        f"**{result['summary']['correct']}/{result['summary']['models']} correct** (every "
        f"float output of every call cosine >= {COS_FLOOR} and relative L2 error <= {REL_CEIL} "
        f"against eager, integer outputs equal, the same generated tokens, no exception); "
        f"{result['summary']['graphs_in_eager']} graphs sent to eager; onnxruntime refused on "
        f"{result['summary']['onnxruntime_refused']} graphs.",
        "",
        "Engines: one per compiled graph in order (`onnx` onnxruntime, `torc` the torch program, "
        "`eage` eager: slower engines, or a fallback). Worst: the lowest cosine / highest "
        "relative error over the forward calls' outputs. Compile: the backend's seconds, "
        "forward + generate.",
        "",
        "| model | source | graphs (fwd + gen) | engines (fwd) | engines (gen) | fallbacks (graph to eager) | worst cos / rel | tokens equal | compile s | correct |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        source = f"{r['source']} @{r.get('commit', '?')}" if mixed else r["source"]
        if "crash" in r or "harness_error" in r:
            why = r.get("crash") or r.get("harness_error")
            lines.append(
                f"| {r['model']} | {source} | - | - | - | - | - | - | - | "
                f"crash: {_cell(str(why)[:150])} |"
            )
            continue
        gen = r.get("generate", {})
        fb = [g["fallback"] for g in _all_graphs(r) if g["fallback"]]
        gen_cell = (
            "-"
            if "generate" not in r
            else ("error" if gen.get("error") else str(gen.get("tokens_equal")))
        )
        lines.append(
            f"| {r['model']} | {source} | {len(r['graphs'])} + {len(gen.get('graphs', []))} | "
            f"{_engines(r['graphs'])} | {_engines(gen.get('graphs', [])) if gen else '-'} | "
            f"{_cell('; '.join(f[:80] for f in fb)) or '-'} | {_worst(r)} | {gen_cell} | "
            f"{r['compile_seconds']} + {gen.get('compile_seconds', 0)} | "
            f"{'yes' if r['correct'] else '**no**'} |"
        )
    lines += ["", "## Engine notes, warnings and exceptions", ""]
    for r in rows:
        notes = []
        for where, graphs in (
            ("fwd", r.get("graphs", [])),
            ("gen", r.get("generate", {}).get("graphs", [])),
        ):
            for g in graphs:
                for eng, why in g.get("engine_notes", {}).items():
                    notes.append(f"{where} g{g['graph']} {eng}: {why}")
                if g.get("fallback"):
                    notes.append(f"{where} g{g['graph']} fallback: {g['fallback']}")
                if g.get("onnxruntime_failures"):
                    notes.append(
                        f"{where} g{g['graph']}: onnxruntime failed on "
                        f"{g['onnxruntime_failures']} calls"
                    )
        if "graphs" in r and not r["graphs"]:
            notes.append("Dynamo captured no graph: every call ran the module in eager")
        for w in r.get("warnings", []) + r.get("generate", {}).get("warnings", []):
            notes.append(f"warning: {w}")
        for c in r.get("calls", []):
            if c.get("error"):
                notes.append(
                    f"exception on {c['shape']}: {c['error']['type']}: "
                    f"{c['error']['message'][:300]}"
                )
            elif not c.get("ok"):
                notes.append(
                    f"call {c['shape']}: cosine {c['cosine']}, rel {c['rel']}, "
                    f"{'; '.join(c['problems'])}"
                )
        gen = r.get("generate", {})
        if gen.get("error"):
            notes.append(
                f"generate exception: {gen['error']['type']}: {gen['error']['message'][:300]}"
            )
        if gen.get("tokens_equal") is False:
            notes.append(f"generate tokens differ: eager {gen.get('want')}, fused {gen.get('got')}")
        if "crash" in r or "harness_error" in r:
            notes.append(f"crash: {str(r.get('crash') or r.get('harness_error'))[:400]}")
        if not notes:
            continue
        lines.append(f"**{r['model']}**")
        lines.append("")
        # a note repeated across graphs is listed once, with its count
        seen: dict[str, int] = {}
        for n in notes:
            seen[n] = seen.get(n, 0) + 1
        lines += [f"- {_cell(n)}" + (f" (x{k})" if k > 1 else "") for n, k in seen.items()]
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

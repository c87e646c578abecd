"""A small causal LM with *trained* weights, built on this machine without any download.

Random weights say little about the error of a lossy transformation (compressed weights, half
precision): their logits are near uniform, so any perturbation barely moves a perplexity. This
module trains a byte-level Llama (:data:`RECIPE`: hidden 256, 4 layers, 4 heads, MLP 768,
vocabulary 256 = the bytes, about 3.5 M parameters) with AdamW on the Python standard library's
own source (``sysconfig.get_paths()["stdlib"]``, its top-level ``*.py`` files), which ships with
every interpreter. The files are split by a hash of their name: about one in eight is held out
for evaluation (:func:`heldout_tokens`) and never trained on.

Training is deterministic: ``torch.manual_seed`` before the model is built, a seeded generator
for the batch offsets, a fixed step count (never a time limit) and one intra-op thread whatever
the machine has. One thread, not two: the suite trains inside one of its two xdist workers
while the other runs, and two OpenMP threads beside a busy core waited on each other (the
training took 597 s there against about 130 s on an idle machine); one thread never
oversubscribes. 500 AdamW steps of 8 x 128 bytes bring the held-out perplexity from 256
(uniform) to about 9; the sidecar records the wall time and the perplexity. (The test suite
trains a smaller recipe of the same code, ``tests/test_trained_lm.py::SUITE``: hidden 128, 2
layers, 400 steps, ~35 s; the benchmarks use :data:`RECIPE`.) It runs once: the
weights are cached under :func:`~graph_autofusion.testing.export.cache_dir` keyed by a hash of the recipe, of the
corpus' bytes and of the library versions, written with
:func:`~graph_autofusion.testing.export.write_cached` (an ``fcntl`` lock, a temporary name and
``os.replace``: concurrent pytest workers train once and never read a partial file). The JSON
sidecar records the training's loss, seconds and held-out perplexity.

* :func:`trained_lm` -> ``(model, tokenizer)``: a fresh ``LlamaForCausalLM`` (eval mode) with
  the trained weights and a :class:`ByteTokenizer`.
* :func:`export_trained_lm` -> the path of a cached ONNX export: ``kind="logits"``
  (``input_ids, attention_mask -> logits``, dynamic batch and sequence, as the zoo's ``llama``)
  or ``kind="kv"`` (the KV-cache decoder form of :mod:`.kv_cache`).
* :func:`heldout_tokens` -> the first ``n`` bytes of the held-out files.

Metrics (perplexity, top-1 agreement, runners) live in :mod:`graph_autofusion.verify.lm_metrics`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sysconfig
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.report import progress
from graph_autofusion.testing.export import cache_dir, write_cached

#: Bump when the training code changes in a way the recipe does not capture.
TRAINED_LM_VERSION = 2

#: Byte-level vocabulary (no special tokens: held-out windows are plain byte runs).
VOCAB = 256

#: Held-out tokens evaluated into the cache's sidecar after training.
_SIDECAR_EVAL_TOKENS = 8192


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the trained weights (its hash keys the cache)."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 768
    max_positions: int = 512
    steps: int = 500
    batch: int = 8
    seq: int = 128
    lr: float = 3e-3
    warmup: int = 10
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 1
    heldout_every: int = 8  # a file whose name hashes to 0 mod this is held out


#: The recipe of :func:`trained_lm`'s default model.
RECIPE = Recipe()


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""

    vocab_size = VOCAB

    def encode(self, text: str) -> np.ndarray:
        """``text`` -> int64 ids of its UTF-8 bytes."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Any) -> str:
        """Token ids -> text (invalid UTF-8 replaced)."""
        data = bytes(int(i) for i in np.asarray(ids).reshape(-1))
        return data.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------ corpus


def _is_heldout(name: str, every: int) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % every == 0


def corpus_files(recipe: Recipe = RECIPE) -> tuple[list[Path], list[Path]]:
    """``(train, heldout)``: the standard library's top-level ``*.py`` files, sorted by name,
    split by a hash of the name (:attr:`Recipe.heldout_every`).

    Raises:
        GraphAutoFusionError: The standard library's source is not on this machine.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    train = [p for p in files if not _is_heldout(p.name, recipe.heldout_every)]
    held = [p for p in files if _is_heldout(p.name, recipe.heldout_every)]
    if not train or not held:
        raise GraphAutoFusionError(
            f"no Python standard-library source under {root} to train the test LM on"
        )
    return train, held


def _concat(files: list[Path]) -> np.ndarray:
    return np.frombuffer(b"".join(p.read_bytes() for p in files), dtype=np.uint8)


@lru_cache(maxsize=4)
def _corpus(recipe: Recipe) -> tuple[np.ndarray, np.ndarray, str]:
    train, held = corpus_files(recipe)
    a, b = _concat(train), _concat(held)
    digest = hashlib.sha256()
    for p in train + held:
        digest.update(p.name.encode() + b"\0")
    digest.update(a.tobytes())
    digest.update(b.tobytes())
    return a, b, digest.hexdigest()[:16]


def heldout_tokens(n: int, recipe: Recipe = RECIPE) -> np.ndarray:
    """The first ``n`` byte tokens (int64, 1-D) of the held-out files, never trained on."""
    held = _corpus(recipe)[1]
    if not 1 <= n <= held.size:
        raise GraphAutoFusionError(f"n must lie in [1, {held.size}] held-out tokens, got {n}")
    return held[:n].astype(np.int64)


def train_tokens(n: int, recipe: Recipe = RECIPE) -> np.ndarray:
    """The first ``n`` byte tokens (int64, 1-D) of the training files: sample inputs for a
    check that must not see the held-out text."""
    train = _corpus(recipe)[0]
    if not 1 <= n <= train.size:
        raise GraphAutoFusionError(f"n must lie in [1, {train.size}] training tokens, got {n}")
    return train[:n].astype(np.int64)


# ----------------------------------------------------------------------------------- model


def lm_config(recipe: Recipe = RECIPE) -> Any:
    """The ``LlamaConfig`` of the recipe (sdpa attention, untied LM head)."""
    import transformers as tf

    cfg = tf.LlamaConfig(
        hidden_size=recipe.hidden,
        intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.heads,
        vocab_size=VOCAB,
        max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def untrained_lm(recipe: Recipe = RECIPE) -> Any:
    """The recipe's model at its seeded initialization (training mode), before any step."""
    import transformers as tf

    torch.manual_seed(recipe.seed)
    return tf.LlamaForCausalLM(lm_config(recipe))


def _versions() -> dict[str, str]:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def recipe_digest(recipe: Recipe = RECIPE) -> str:
    """Hash of the recipe, the corpus bytes, the library versions and the code version."""
    key = json.dumps(
        {
            "recipe": dataclasses.asdict(recipe),
            "corpus": _corpus(recipe)[2],
            "versions": _versions(),
            "v": TRAINED_LM_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def weights_path(recipe: Recipe = RECIPE) -> Path:
    """Where the trained weights of ``recipe`` are cached (the file may not exist yet)."""
    return cache_dir() / f"trained_lm-{recipe_digest(recipe)}.pt"


def _lr(recipe: Recipe, step: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    frac = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _train(recipe: Recipe) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    train, _, _ = _corpus(recipe)
    data = torch.from_numpy(train.astype(np.int64))
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    start = time.perf_counter()
    try:
        model = untrained_lm(recipe).train()
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        rest = [p for n, p in model.named_parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": rest}],
            lr=recipe.lr,
            betas=(0.9, 0.95),
            weight_decay=0.0,
        )
        gen = torch.Generator().manual_seed(recipe.seed + 1)
        offs = torch.arange(recipe.seq + 1)
        losses: list[float] = []
        for step in range(recipe.steps):
            starts = torch.randint(0, data.numel() - recipe.seq - 1, (recipe.batch,), generator=gen)
            chunk = data[starts[:, None] + offs]
            for group in opt.param_groups:
                group["lr"] = _lr(recipe, step)
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), chunk[:, 1:].flatten()
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
        model.eval()
        seconds = time.perf_counter() - start
        ppl = _heldout_ppl(model, recipe)
    finally:
        torch.set_num_threads(threads)
    tail = losses[-20:]
    info = {
        "recipe": dataclasses.asdict(recipe),
        "train_seconds": round(seconds, 2),
        "first_loss": round(losses[0], 4),
        "final_loss": round(sum(tail) / len(tail), 4),
        "heldout_tokens": _SIDECAR_EVAL_TOKENS,
        "heldout_ppl": round(ppl, 4),
        "params": sum(p.numel() for p in model.parameters()),
    }
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, info


def _heldout_ppl(model: Any, recipe: Recipe) -> float:
    """Perplexity of the first held-out tokens in windows of ``recipe.seq`` (as
    :func:`~graph_autofusion.verify.lm_metrics.perplexity`), the windows batched."""
    held = _corpus(recipe)[1]
    count = min(_SIDECAR_EVAL_TOKENS, held.size) // recipe.seq * recipe.seq
    windows = torch.from_numpy(held[:count].astype(np.int64)).view(-1, recipe.seq)
    total = 0.0
    with torch.no_grad():
        for batch in windows.split(16):
            logits = model(input_ids=batch, use_cache=False).logits[:, :-1]
            total += float(
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB).double(), batch[:, 1:].flatten(), reduction="sum"
                )
            )
    return math.exp(total / (windows.shape[0] * (recipe.seq - 1)))


def ensure_trained(recipe: Recipe = RECIPE) -> tuple[Path, bool]:
    """Train ``recipe`` unless its weights are cached; ``(weights file, trained now)``."""
    path = weights_path(recipe)
    trained = False

    def produce(tmp: Path) -> dict[str, Any]:
        nonlocal trained

        with progress.task(f"train the test LM ({recipe.steps} steps)"):
            state, info = _train(recipe)
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
        trained = True
        return {**info, "name": "trained_lm", "digest": recipe_digest(recipe)}

    write_cached(path, "the trained test LM", produce)
    return path, trained


def trained_lm_info(recipe: Recipe = RECIPE) -> dict[str, Any]:
    """The JSON sidecar of the cached weights (training first if needed)."""
    path = ensure_trained(recipe)[0]
    return json.loads(path.with_name(path.name + ".json").read_text())


def trained_lm(recipe: Recipe = RECIPE) -> tuple[Any, ByteTokenizer]:
    """``(model, tokenizer)``: a fresh ``LlamaForCausalLM`` in eval mode with the trained
    weights of ``recipe`` (trained once, then loaded from the cache) and its byte tokenizer.
    Every call builds a new module, so callers may mutate it."""
    path = ensure_trained(recipe)[0]
    model = untrained_lm(recipe)
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval(), ByteTokenizer()


# ---------------------------------------------------------------------------------- exports

#: Export forms: ``logits`` (no cache) and ``kv`` (KV-cache decoder, as :mod:`.kv_cache`).
EXPORT_KINDS: tuple[str, ...] = ("logits", "kv")

_TRACE_SEQ, _TRACE_PAST = 16, 4


def export_path(kind: str = "logits", exporter: str = "dynamo", recipe: Recipe = RECIPE) -> Path:
    """Where :func:`export_trained_lm` caches this export (the file may not exist yet)."""
    from graph_autofusion.testing.export import EXPORTERS, TORCHSCRIPT_OPSET

    if kind not in EXPORT_KINDS:
        raise GraphAutoFusionError(f"unknown export kind {kind!r}; choose one of {EXPORT_KINDS}")
    if exporter not in EXPORTERS:
        raise GraphAutoFusionError(f"unknown exporter {exporter!r}; choose one of {EXPORTERS}")
    import onnx
    import onnxscript

    key = json.dumps(
        {
            "weights": recipe_digest(recipe),
            "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__,
            "opset": TORCHSCRIPT_OPSET,
            "trace": [_TRACE_SEQ, _TRACE_PAST],
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"trained_lm-{kind}-{exporter}-{digest}.onnx"


def kv_names(recipe: Recipe = RECIPE) -> tuple[list[str], list[str]]:
    """ONNX input and output names of the ``kv`` export (as :mod:`.kv_cache`'s decoders)."""
    past = [f"past_key_values.{i}.{t}" for i in range(recipe.layers) for t in ("key", "value")]
    present = [f"present.{i}.{t}" for i in range(recipe.layers) for t in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def _export_args(kind: str, recipe: Recipe) -> tuple[tuple[torch.Tensor, ...], list, list, dict]:
    """``(args, input names, output names, TorchScript dynamic axes)`` of an export kind."""
    gen = torch.Generator().manual_seed(1)
    if kind == "logits":
        ids = torch.randint(0, VOCAB, (1, _TRACE_SEQ), generator=gen)
        axes = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "logits")}
        names = ["input_ids", "attention_mask"], ["logits"]
        return (ids, torch.ones_like(ids)), *names, axes
    inputs, outputs = kv_names(recipe)
    head_dim = recipe.hidden // recipe.heads
    ids = torch.randint(0, VOCAB, (1, 3), generator=gen)
    mask = torch.ones(1, _TRACE_PAST + 3, dtype=torch.int64)
    pos = torch.arange(_TRACE_PAST, _TRACE_PAST + 3)[None]
    past = [torch.randn(1, recipe.heads, _TRACE_PAST, head_dim, generator=gen) for _ in inputs[3:]]
    axes = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        "logits": {0: "batch", 1: "seq"},
        **{n: {0: "batch", 2: "past"} for n in inputs[3:]},
        **{n: {0: "batch", 2: "total"} for n in outputs[1:]},
    }
    return (ids, mask, pos, *past), inputs, outputs, axes


def _dynamo_shapes(kind: str, recipe: Recipe) -> tuple:
    from torch.export import Dim

    batch = Dim("batch", min=1, max=64)
    seq = Dim("seq", min=2 if kind == "logits" else 1, max=recipe.max_positions)
    if kind == "logits":
        return ({0: batch, 1: seq}, {0: batch, 1: seq})
    past = Dim("past", min=0, max=recipe.max_positions)
    total = Dim("total", min=1, max=2 * recipe.max_positions)
    per_past = tuple({0: batch, 2: past} for _ in range(2 * recipe.layers))
    return ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, per_past)


def _export(kind: str, exporter: str, recipe: Recipe, dest: Path) -> int:
    from graph_autofusion.testing.builders import CausalLMLogits
    from graph_autofusion.testing.export import TORCHSCRIPT_OPSET, quiet
    from graph_autofusion.testing.kv_cache import KVDecoder

    model = trained_lm(recipe)[0]
    module = (CausalLMLogits(model) if kind == "logits" else KVDecoder(model)).eval()
    args, inputs, outputs, axes = _export_args(kind, recipe)
    with quiet(), torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(
                module,
                args,
                str(dest),
                dynamo=False,
                opset_version=TORCHSCRIPT_OPSET,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
            )
            return TORCHSCRIPT_OPSET
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            dynamic_shapes=_dynamo_shapes(kind, recipe),
            input_names=inputs,
            output_names=outputs,
            verbose=False,
        )
        program.save(str(dest), external_data=False)
    return int(dict((o.domain, o.version) for o in program.model_proto.opset_import)[""])


def export_trained_lm(
    kind: str = "logits", exporter: str = "dynamo", recipe: Recipe = RECIPE
) -> Path:
    """Export the trained LM to ONNX (or return the cached export), training it first if needed.

    Args:
        kind: ``"logits"``: ``(input_ids, attention_mask) -> logits`` with dynamic batch and
            sequence (as the zoo's ``llama`` export); ``"kv"``: the KV-cache decoder
            (:func:`kv_names`; one graph for prefill, past length 0, and decode steps).
        exporter: ``"dynamo"`` or ``"torchscript"`` (opset 18).
        recipe: The training recipe (default :data:`RECIPE`).

    Returns:
        Path of a self-contained ONNX file (weights inside).

    Raises:
        GraphAutoFusionError: Unknown kind/exporter, or the exporter failed.
    """
    path = export_path(kind, exporter, recipe)

    def produce(tmp: Path) -> dict[str, Any]:
        start = time.perf_counter()
        opset = _export(kind, exporter, recipe, tmp)
        return {
            "name": "trained_lm",
            "kind": kind,
            "exporter": exporter,
            "opset": opset,
            "weights": recipe_digest(recipe),
            "export_seconds": round(time.perf_counter() - start, 3),
        }

    return write_cached(path, f"the trained test LM ({kind}, {exporter} exporter)", produce)

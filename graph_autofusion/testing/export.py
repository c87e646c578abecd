"""ONNX exports of the zoo models with both torch exporters, cached on disk.

``export_onnx(name, exporter)`` exports once and then returns the cached file. The cache key is
the model name, the exporter, ``seq_len`` and a hash of the library versions (torch,
transformers, onnxscript, onnx) and the model configuration. Files are written to a per-process
temporary name and moved into place with ``os.replace`` under an ``fcntl`` lock, so concurrent
pytest-xdist workers neither corrupt nor duplicate an export. Each export gets a JSON sidecar
(``<file>.json``) recording its wall time, opset, dynamic axes and versions.

Exporter settings:

* ``dynamo``: ``torch.onnx.export(..., dynamo=True)`` with its default opset and optimizer;
  ``resnet50_bn`` instead exports unoptimized and then runs only constant folding and clean-up
  passes, because the default rewriter folds BatchNormalization into Conv.
* ``torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=18)``; ``resnet50_bn``
  uses ``do_constant_folding=False`` (constant folding is what fuses BatchNormalization).

Shapes: the transformer models (llama, llama_gqa, bert, gpt2, minilm) have dynamic ``batch``
and ``seq`` axes in both exporters (traced at batch 1, ``seq_len`` >= 2). ResNet-50 and the
LSTM are exported with static shapes (1x3x224x224 and 1x``seq_len``x32).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graph_autofusion import env
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.report import progress
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.builders import (
    build_model,
    example_inputs,
    minilm_sentence_embeddings,
    minilm_tokenize,
)
from graph_autofusion.testing.specs import config_fingerprint, model_spec
from graph_autofusion.verify.lm_metrics import row_cosines

EXPORTERS: tuple[str, ...] = ("dynamo", "torchscript")

#: Opset of the TorchScript exporter (the dynamo exporter uses its own default).
TORCHSCRIPT_OPSET = 18

_NOISY_LOGGERS = (
    "torch.onnx",
    "torch.export",
    "torch._export",
    "torch._dynamo",
    "torch.fx",
    "onnxscript",
    "onnx_ir",
    "transformers",
)


def _repo_root() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    return None


def cache_dir() -> Path:
    """Directory of cached exports (created on demand).

    ``$GRAPH_AUTOFUSION_CACHE`` if set, else ``<repo>/.cache/models`` (the folder holding
    ``pyproject.toml`` above the package), else ``~/.cache/graph_autofusion``.
    """
    cache = env.cache_dir()
    if cache:
        path = Path(cache).expanduser()
    else:
        root = _repo_root()
        path = root / ".cache" / "models" if root else Path.home() / ".cache" / "graph_autofusion"
    path.mkdir(parents=True, exist_ok=True)
    return path


def tool_versions() -> dict[str, str]:
    import onnx
    import onnxscript
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxscript": onnxscript.__version__,
        "onnx": onnx.__version__,
    }


def _check_args(name: str, exporter: str, seq_len: int) -> None:
    model_spec(name)
    if exporter not in EXPORTERS:
        raise GraphAutoFusionError(f"unknown exporter {exporter!r}; choose one of {EXPORTERS}")
    if seq_len < 1:
        raise GraphAutoFusionError(f"seq_len must be >= 1, got {seq_len}")


def export_path(name: str, exporter: str = "dynamo", *, seq_len: int = 16) -> Path:
    """Where :func:`export_onnx` caches this export (the file may not exist yet)."""
    _check_args(name, exporter, seq_len)
    key = json.dumps(
        {"fp": config_fingerprint(name), "versions": tool_versions(), "opset": TORCHSCRIPT_OPSET},
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"{name}-{exporter}-s{seq_len}-{digest}.onnx"


def export_info(name: str, exporter: str = "dynamo", *, seq_len: int = 16) -> dict[str, Any]:
    """The JSON sidecar of a cached export (exporting first if needed)."""
    path = export_onnx(name, exporter, seq_len=seq_len)
    return json.loads(path.with_name(path.name + ".json").read_text())


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence exporter warnings, log records and progress prints."""
    loggers = [logging.getLogger(n) for n in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def export_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: temp names + os.replace still atomic
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _dynamic(name: str, seq_len: int) -> bool:
    spec = model_spec(name)
    return bool(spec.dynamic_axes) and 2 <= seq_len <= spec.max_seq


def _export_dynamo(name: str, module: torch.nn.Module, inputs: dict, dest: Path, dyn: bool) -> int:
    spec = model_spec(name)
    dynamic_shapes = None
    if dyn:
        from torch.export import Dim

        dims = {"batch": Dim("batch", min=1, max=1024), "seq": Dim("seq", min=2, max=spec.max_seq)}
        dynamic_shapes = {
            n: {ax: dims[sym] for ax, sym in spec.dynamic_axes[n].items()} for n in spec.input_names
        }
    keep_bn = name == "resnet50_bn"
    program = torch.onnx.export(
        module,
        (),
        kwargs=inputs,
        dynamo=True,
        dynamic_shapes=dynamic_shapes,
        output_names=list(spec.output_names),
        optimize=not keep_bn,
        verbose=False,
    )
    if keep_bn:
        _optimize_keep_batchnorm(program.model)
    program.save(str(dest), external_data=False)
    return int(dict((o.domain, o.version) for o in program.model_proto.opset_import)[""])


def _optimize_keep_batchnorm(model: Any) -> None:
    """Constant folding and clean-up of an ``onnx_ir`` model, without BatchNorm fusion."""
    import onnx_ir as ir
    import onnx_ir.passes.common as cp
    from onnxscript.optimizer import fold_constants_ir

    fold_constants_ir(model)
    ir.passes.Sequential(
        cp.RemoveUnusedNodesPass(),
        cp.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        cp.DeduplicateInitializersPass(),
        cp.CommonSubexpressionEliminationPass(),
        cp.RemoveUnusedNodesPass(),
        cp.NameFixPass(),
    )(model)


def _export_torchscript(
    name: str, module: torch.nn.Module, inputs: dict, dest: Path, dyn: bool
) -> int:
    spec = model_spec(name)
    torch.onnx.export(
        module,
        tuple(inputs[n] for n in spec.input_names),
        str(dest),
        dynamo=False,
        opset_version=TORCHSCRIPT_OPSET,
        input_names=list(spec.input_names),
        output_names=list(spec.output_names),
        dynamic_axes=spec.dynamic_axes if dyn else None,
        do_constant_folding=name != "resnet50_bn",
    )
    return TORCHSCRIPT_OPSET


def write_cached(path: Path, what: str, produce: Callable[[Path], dict[str, Any]]) -> Path:
    """Create the cached file ``path`` once, safely under concurrency, with its JSON sidecar.

    ``produce(tmp)`` writes the file to the temporary path ``tmp`` and returns the sidecar's
    fields; ``file_bytes``, ``created`` and ``versions`` are added. It runs under the ``fcntl``
    lock of ``path`` and only when ``path`` does not exist (also after waiting for the lock);
    the file and the sidecar are moved into place with ``os.replace``.

    Raises:
        GraphAutoFusionError: ``produce`` failed (``what`` names the export in the message).
    """
    if path.is_file():
        return path
    with export_lock(path):
        if path.is_file():  # another process exported it while we waited
            return path
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            info = {
                **produce(tmp),
                "file_bytes": tmp.stat().st_size,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "versions": tool_versions(),
            }
            side_tmp = tmp.with_suffix(".json.tmp")
            side_tmp.write_text(json.dumps(info, indent=2, sort_keys=True))
            os.replace(side_tmp, path.with_name(path.name + ".json"))
            os.replace(tmp, path)
        except Exception as exc:
            raise GraphAutoFusionError(f"exporting {what} failed: {exc}") from exc
        finally:
            for leftover in (tmp, tmp.with_suffix(".json.tmp")):
                leftover.unlink(missing_ok=True)
    return path


def _with_progress(fn: Any, label: str) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:

        with progress.task(label):
            return fn(*args, **kwargs)

    return run


def export_onnx(name: str, exporter: str = "dynamo", *, seq_len: int = 16) -> Path:
    """Export a zoo model to ONNX (or return the cached export).

    Args:
        name: One of :data:`~graph_autofusion.testing.specs.ALL_NAMES`.
        exporter: ``"dynamo"`` or ``"torchscript"``.
        seq_len: Sequence length of the traced example inputs.

    Returns:
        Path of a self-contained ONNX file (weights inside, no external data).

    Raises:
        GraphAutoFusionError: Unknown model/exporter, or the exporter failed.
    """

    def produce(tmp: Path) -> dict[str, Any]:
        module, inputs = build_model(name, seq_len=seq_len)
        dyn = _dynamic(name, seq_len)
        fn = _export_dynamo if exporter == "dynamo" else _export_torchscript
        fn = _with_progress(fn, f"export {name} ({exporter})")
        start = time.perf_counter()
        with quiet(), torch.no_grad():
            opset = fn(name, module, inputs, tmp, dyn)
        return {
            "name": name,
            "exporter": exporter,
            "seq_len": seq_len,
            "opset": opset,
            "dynamic_axes": model_spec(name).dynamic_axes if dyn else {},
            "export_seconds": round(time.perf_counter() - start, 3),
        }

    path = export_path(name, exporter, seq_len=seq_len)
    return write_cached(path, f"{name!r} with the {exporter} exporter", produce)


def example_feeds(name: str, *, seq_len: int = 16, batch: int = 1) -> dict[str, np.ndarray]:
    """The example inputs of :func:`~graph_autofusion.testing.models.example_inputs` as NumPy.

    Keys are the ONNX input names of every export of ``name``.
    """
    return {k: v.numpy() for k, v in example_inputs(name, seq_len=seq_len, batch=batch).items()}


#: Sentences for MiniLM sentence-embedding checks: a paraphrase pair, then two unrelated ones.
MINILM_CHECK_SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps over a sleepy hound.",
    "Operator fusion removes memory traffic between kernels.",
    "It rained all day in the mountains.",
)


def ort_outputs(
    model: Any, feeds: dict[str, np.ndarray], *, threads: int | None = None
) -> dict[str, np.ndarray]:
    """Run ``model`` (an ``onnx.ModelProto``, an IR ``Model`` or a path) once in onnxruntime's
    CPU provider with its default graph optimizations and return its outputs by name.

    ``feeds`` may hold more arrays than the model takes: only its inputs are passed.
    ``threads``: intra-op threads (inter-op 1); onnxruntime's defaults when ``None``.
    """

    # threads 0 and spinning workers: onnxruntime's defaults
    sess = ort_session(model, "all", threads if threads is not None else 0, spinning=True)
    names = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    return {o.name: a for o, a in zip(sess.get_outputs(), outs, strict=True)}


def minilm_onnx_embeddings(
    model: Any, sentences: tuple[str, ...] = MINILM_CHECK_SENTENCES, *, seq_len: int = 16
) -> np.ndarray:
    """MiniLM sentence embeddings (mean pooling, L2 norm) of ``sentences`` computed with an ONNX
    export of MiniLM (``model`` as in :func:`ort_outputs`) in onnxruntime, 2 threads."""

    enc = minilm_tokenize(list(sentences), seq_len=seq_len)
    feeds = {k: v.numpy() for k, v in enc.items()}
    hidden = ort_outputs(model, feeds, threads=2)["last_hidden_state"]
    return minilm_sentence_embeddings(torch.from_numpy(hidden), enc["attention_mask"]).numpy()


def minilm_cosines(
    model: Any,
    reference: Any = None,
    sentences: tuple[str, ...] = MINILM_CHECK_SENTENCES,
    *,
    seq_len: int = 16,
) -> np.ndarray:
    """Per-sentence cosine of the MiniLM sentence embeddings (:func:`minilm_onnx_embeddings`)
    of ``model`` (a fused or compressed MiniLM) against those of ``reference`` (default: the
    zoo's fp32 ``minilm`` export)."""

    ref = reference if reference is not None else export_onnx("minilm")
    return row_cosines(
        minilm_onnx_embeddings(ref, sentences, seq_len=seq_len),
        minilm_onnx_embeddings(model, sentences, seq_len=seq_len),
    )

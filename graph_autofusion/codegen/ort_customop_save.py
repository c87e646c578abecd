"""A fused model saved with its custom-operator library: the kernel folder beside the model
(sources, library, manifest), the metadata naming it, and the line that loads it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from graph_autofusion.codegen.compiler import (
    compiler_version,
    write_atomic,
)
from graph_autofusion.codegen.ort_customop_c import (
    DOMAIN,
    op_name,
)
from graph_autofusion.codegen.ort_customop_registry import (
    META_DOMAIN,
    META_LIBRARY,
    library_ops,
    meta_for,
)
from graph_autofusion.codegen.ort_gelu import OPS as GELU_OPS
from graph_autofusion.codegen.ort_gemv import OP as GEMV_OP
from graph_autofusion.codegen.ort_gemv_f16 import OP as GEMV_F16_OP
from graph_autofusion.codegen.ort_gemv_q import OP as GEMV_Q_OP
from graph_autofusion.errors import GraphAutoFusionError, ModelWriteError
from graph_autofusion.files import copy_beside

if TYPE_CHECKING:  # pragma: no cover - ort_customop imports this module
    from graph_autofusion.codegen.ort_customop import CustomOpLibrary


KERNEL_DIR_FORMAT = "graph-autofusion onnxruntime custom operators 1"


LIBRARY_NAME = "libgaf_custom_ops.so"


def _ours(directory: str) -> bool:
    import json

    try:
        with open(os.path.join(directory, "manifest.json")) as f:
            return json.load(f).get("format") == KERNEL_DIR_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def kernel_dir_for(model_path: str) -> str:
    """The kernel folder of a fused model: ``<model file>.kernels`` (``fused.onnx.kernels``),
    or ``.kernels-2``, ``-3`` ... when that name is taken by something that is not one of our
    kernel folders (the user's files are never touched)."""
    base = os.path.abspath(model_path) + ".kernels"
    for i in range(1, 1000):
        cand = base if i == 1 else f"{base}-{i}"
        if not os.path.lexists(cand) or (os.path.isdir(cand) and _ours(cand)):
            return cand
    raise GraphAutoFusionError(f"no free kernel folder name next to {model_path}")


def _gemv_sig(op: str, weights: str) -> str:
    return f"{op}(x f32[..., K], {weights}) -> f32[..., N]"


def write_kernel_dir(library: CustomOpLibrary, directory: str, groups: Sequence[Any]) -> dict:
    """Write ``custom_ops.c``, the library and ``manifest.json`` into ``directory``."""
    import dataclasses
    import hashlib
    import json

    os.makedirs(directory, exist_ok=True)
    with open(library.source_path, "rb") as f:
        source = f.read()
    write_atomic(os.path.join(directory, "custom_ops.c"), source)
    copy_beside(library.path, os.path.join(directory, LIBRARY_NAME))
    kernels = {op_name(k): k for k in library.kernels}
    data = {
        "format": KERNEL_DIR_FORMAT,
        "domain": DOMAIN,
        "library": LIBRARY_NAME,
        "source": "custom_ops.c",
        "source_sha256": hashlib.sha256(source).hexdigest(),
        "compiler": compiler_version(library.options.compiler),
        "compile_options": json.loads(json.dumps(dataclasses.asdict(library.options))),
        "load": (
            "so = onnxruntime.SessionOptions(); "
            f"so.register_custom_ops_library('<this folder>/{LIBRARY_NAME}')"
        ),
        "operators": [
            {
                "name": name,
                "kernel": k.name,
                "signature": k.signature(),
                "fused_ops": list(k.fused_ops),
                "inputs": [i.dtype for i in k.inputs],
                "outputs": [o.dtype for o in k.outputs],
            }
            for name, k in kernels.items()
        ]
        + [
            {
                "name": op,
                "kernel": f"graph_autofusion/codegen/{src}.py",
                "signature": signature,
                "inputs": list(types),
                "outputs": ["f32"],
            }
            for op, src, signature, types in (
                (GEMV_OP, "ort_gemv", _gemv_sig(GEMV_OP, "f32 Wt[N, K]"), ("f32", "f32")),
                (
                    GEMV_F16_OP,
                    "ort_gemv_f16",
                    _gemv_sig(GEMV_F16_OP, "f16 Wp[N/16, K, 16] or Wt[N, K]"),
                    ("f32", "f16"),
                ),
                (
                    GEMV_Q_OP,
                    "ort_gemv_q",
                    _gemv_sig(
                        GEMV_Q_OP, "u8 Wq[N/16, K/4, 64 or 32], f16 or f32 S[N/16, nb, 16], u8 Z"
                    ),
                    ("f32", "u8", "f16|f32", "u8"),
                ),
                *(
                    (
                        op,
                        "ort_gelu",
                        f"{op}(x f32[..., N], bias f32[N] optional) -> f32[..., N]",
                        ("f32", "f32"),
                    )
                    for op in GELU_OPS
                ),
            )  # fmt: skip
            if op in library.ops
        ],
        "groups": [
            {
                "key": g.key,
                "rule": g.rule,
                "operator": g.op,
                "nodes": list(g.original_nodes),
                "kept_before_it": list(g.prologue),
                "inputs": list(g.input_names),
                "outputs": list(g.output_names),
            }
            for g in groups
            if g.op in kernels
        ],
    }
    write_atomic(
        os.path.join(directory, "manifest.json"), json.dumps(data, indent=2).encode() + b"\n"
    )
    return data


def save_with_library(model: Any, dest: str, library: CustomOpLibrary | None, groups: Any) -> str:
    """Save the fused IR ``model`` to ``dest``; with custom operators, first its kernel folder
    (:func:`kernel_dir_for`) and the metadata naming the library relative to the model.
    Returns the folder (``""`` without custom operators)."""
    from graph_autofusion.frontend.onnx_frontend import save_onnx  # onnx: optional, heavy

    dest = os.path.abspath(dest)
    folder_of = os.path.dirname(dest)
    if os.path.isdir(dest) or not os.path.isdir(folder_of) or not os.access(folder_of, os.W_OK):
        raise ModelWriteError(f"{dest}: cannot write the fused model there")
    meta = dict(model.metadata_props)
    for k in (META_LIBRARY, META_DOMAIN):
        meta.pop(k, None)
    folder = ""
    if library is not None and library_ops(model):
        folder = kernel_dir_for(dest)
        created = not os.path.exists(folder)
        write_kernel_dir(library, folder, groups)
        rel = os.path.relpath(os.path.join(folder, LIBRARY_NAME), os.path.dirname(dest))
        meta.update(meta_for(rel))
    old = model.metadata_props
    model.metadata_props = meta
    try:
        save_onnx(model, dest)
    except BaseException:
        if folder and created:  # no model: no folder of ours left behind
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        model.metadata_props = old
    return folder


def load_line(model_path: str) -> str:
    """The Python a user writes to run a saved fused model that needs the library."""
    return (
        "from graph_autofusion.runtime.ort_session import fused_session; "
        f"sess = fused_session({model_path!r})"
    )

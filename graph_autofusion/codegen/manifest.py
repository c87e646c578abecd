"""The compiled kernel directory (F1, F15 ``compile_fused_operators``).

    write_kernel_dir(result, "kernels/")   # kernels.c, kernels.so, manifest.json

The manifest lists every fused group (its kernel, fused operators, graph nodes, signature,
input and output dtypes) and every distinct kernel (source hash, compile options, compiler).
Files are written to temporary names and renamed into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from graph_autofusion.codegen.c_backend import library_source
from graph_autofusion.codegen.compiler import compiler_version, write_atomic
from graph_autofusion.files import copy_beside


def manifest(result: Any) -> dict[str, Any]:
    """The manifest of a cpu-target fuse result (see the module docstring)."""
    live = {low.key for low in result.lowered}
    groups = [g for g in result.kernels if g.key in live]
    kernels = {g.kernel.name: g.kernel for g in groups}
    lib = result.library
    opts = lib.options if lib is not None else None
    source = library_source(list(kernels.values())) if kernels else ""
    return {
        "format": "graph-autofusion kernels 1",
        "library": "kernels.so" if lib is not None else None,
        "source": "kernels.c",
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "compiler": compiler_version(opts.compiler) if opts is not None else None,
        "compile_options": json.loads(json.dumps(dataclasses.asdict(opts))) if opts else None,
        "calling_convention": (
            "void NAME(const int64_t *sizes, void *const *operands, const int64_t *strides, "
            "int64_t threads); NAME_g takes every stride at run time"
        ),
        "kernels": [
            {
                "name": k.name,
                "signature": k.signature(),
                "fused_ops": list(k.fused_ops),
                "inputs": [i.dtype for i in k.inputs],
                "outputs": [o.dtype for o in k.outputs],
                "reduce_axes": list(k.reduce_axes),
                "digest": k.digest(),
            }
            for k in kernels.values()
        ],
        "groups": [
            {
                "key": g.key,
                "rule": g.rule,
                "kernel": g.kernel.name,
                "nodes": g.node_names,
                "inputs": g.input_names,
                "outputs": g.output_names,
                "prologue": g.prologue,
            }
            for g in groups
        ],
    }


def write_kernel_dir(result: Any, directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``kernels.c``, ``kernels.so`` and ``manifest.json`` into ``directory``."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    data = manifest(result)
    live = {low.key for low in result.lowered}
    kernels = {g.kernel.name: g.kernel for g in result.kernels if g.key in live}
    write_atomic(
        os.path.join(directory, "kernels.c"), library_source(list(kernels.values())).encode()
    )
    if result.library is not None:
        copy_beside(result.library.path, os.path.join(directory, "kernels.so"))
    write_atomic(
        os.path.join(directory, "manifest.json"), json.dumps(data, indent=2).encode() + b"\n"
    )
    return data

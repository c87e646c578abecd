"""Batch compilation and the kernel cache: one library per batch, hits across processes,
invalidation by compiler and options, typed errors, concurrent writers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import pytest

from graph_autofusion.codegen import c_backend
from graph_autofusion.codegen.compiler import (
    CodegenOptions,
    CompilerNotFoundError,
    KernelCompileError,
    compile_library,
)
from graph_autofusion.codegen.lower import lower_group
from graph_autofusion.pipeline.cpu_kernels import finalize_kernel
from graph_autofusion.testing.fused_groups import RngChooser, random_group


def _kernels(n: int, seed0: int = 0):
    out = []
    for s in range(seed0, seed0 + n):
        g = random_group(RngChooser(s), name=f"c{s}")
        low = lower_group(g.nodes, g.outputs, None, opset=20)
        out.append(finalize_kernel(low.kernel, [g.feeds[i.name].shape for i in low.kernel.inputs]))
    return list({k.name: k for k in out}.values())


def test_a_batch_of_30_kernels_is_one_library_then_a_cache_hit(tmp_path):
    kernels = _kernels(30)
    assert len(kernels) >= 25
    cold = compile_library(kernels, cache_dir=tmp_path)
    assert not cold.from_cache and os.path.exists(cold.path)
    assert sorted(os.listdir(os.path.dirname(cold.path))) == ["kernels.c", "kernels.so"]
    src = open(cold.source_path).read()
    assert all(f"void {k.name}_g(" in src for k in kernels)
    warm = compile_library(kernels, cache_dir=tmp_path)
    assert warm.from_cache and warm.path == cold.path


def test_cache_survives_a_restart_and_changes_with_options_and_compiler(tmp_path):
    kernels = _kernels(3, 100)
    first = compile_library(kernels, cache_dir=tmp_path)
    code = textwrap.dedent(
        f"""
        from graph_autofusion.codegen.compiler import compile_library
        from tests.codegen.test_compiler import _kernels
        lib = compile_library(_kernels(3, 100), cache_dir={str(tmp_path)!r})
        print(lib.from_cache, lib.key)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(), check=True
    )
    assert out.stdout.split() == ["True", first.key]
    other = compile_library(kernels, CodegenOptions(opt_level=2), cache_dir=tmp_path)
    assert other.key != first.key and not other.from_cache
    # a different compiler (same gcc behind another name reports another version line) recompiles
    wrapper = tmp_path / "mycc"
    wrapper.write_text(
        '#!/bin/sh\nif [ "$1" = "--version" ]; then echo "mycc 9.9"; exit 0; fi\nexec cc "$@"\n'
    )
    wrapper.chmod(0o755)
    third = compile_library(kernels, CodegenOptions(compiler=str(wrapper)), cache_dir=tmp_path)
    assert third.key not in (first.key, other.key) and not third.from_cache


def test_a_compiler_failure_raises_a_typed_error_with_source_and_repro(tmp_path, monkeypatch):
    kernels = _kernels(2, 200)
    monkeypatch.setattr(c_backend, "PRELUDE", c_backend.PRELUDE + "\nthis is not C;\n")
    with pytest.raises(KernelCompileError) as info:
        compile_library(kernels, cache_dir=tmp_path)
    err = info.value
    assert os.path.exists(err.source_path) and "this is not C" in open(err.source_path).read()
    assert "error" in err.stderr and err.source_path in err.command
    # nothing half-written is left where a later run would take it from the cache
    for entry in os.listdir(tmp_path):
        assert "kernels.so" not in os.listdir(tmp_path / entry)


def test_no_compiler_names_what_to_install(tmp_path):
    with pytest.raises(CompilerNotFoundError, match="install gcc"):
        compile_library(
            _kernels(1, 300), CodegenOptions(compiler="no-such-cc-xyz"), cache_dir=tmp_path
        )


def _compile_in_child(args):
    cache, seed = args
    lib = compile_library(_kernels(4, seed), cache_dir=cache)
    return lib.key, os.path.getsize(lib.path)


def test_two_processes_compiling_the_same_library_both_succeed(tmp_path):
    with ProcessPoolExecutor(2) as pool:
        a, b = pool.map(_compile_in_child, [(str(tmp_path), 400), (str(tmp_path), 400)])
    assert a == b
    entries = os.listdir(tmp_path)
    assert len(entries) == 1
    assert sorted(f for f in os.listdir(tmp_path / entries[0]) if not f.startswith(".")) == [
        "kernels.c",
        "kernels.so",
    ]


def test_options_are_frozen_and_hashed():
    opts = CodegenOptions()
    with pytest.raises(Exception):  # noqa: B017 - dataclasses.FrozenInstanceError
        opts.opt_level = 1  # type: ignore[misc]
    assert opts.digest() == CodegenOptions().digest()
    assert replace(opts, vector_width=256).digest() != opts.digest()

"""Batch compilation of generated kernels into one shared library, with an on-disk cache.

    opts = CodegenOptions()                        # frozen; its digest is part of the cache key
    lib = compile_library(kernels, opts)           # one gcc call for every kernel of a model
    lib.path, lib.source_path, lib.from_cache

The cache key is the SHA-256 of the C source, the options' digest and the compiler's version
line, so a new compiler or a changed option compiles anew. The cache lives in
``$GRAPH_AUTOFUSION_CACHE/kernels`` (default ``~/.cache/graph-autofusion/kernels``); each entry
is a folder named by the key holding ``kernels.c`` and ``kernels.so``. Writes go to a private
temporary name in the same folder and are renamed into place (atomic on POSIX), so two
processes compiling the same library both succeed and neither reads a half-written file.

A failing compiler raises :class:`KernelCompileError` with the source path, the compiler's
stderr and a one-line command that reproduces the failure; no compiler at all raises
:class:`CompilerNotFoundError` naming what to install.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from graph_autofusion import env
from graph_autofusion.codegen.c_backend import library_source
from graph_autofusion.codegen.kernel_ir import Kernel
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.files import temp_beside


class KernelCompileError(GraphAutoFusionError):
    """The C compiler rejected generated code."""

    def __init__(self, message: str, source_path: str, stderr: str, command: str) -> None:
        super().__init__(
            f"{message}\n  source: {source_path}\n  repro: {command}\n{stderr[-4000:]}"
        )
        self.source_path = source_path
        self.stderr = stderr
        self.command = command


class CompilerNotFoundError(GraphAutoFusionError):
    """No C compiler: the codegen target cannot build kernels."""


@dataclass(frozen=True)
class CodegenOptions:
    """Everything that changes the generated code or its binary (hashed into the cache key).

    Attributes:
        compiler: C compiler command (``$CC``, else ``cc``).
        opt_level: ``-O`` level.
        march: ``-march`` value (``native``: this machine's vector units).
        vector_width: ``-mprefer-vector-width`` (512 uses AVX-512's zmm registers).
        parallel_min_elements: Below this many loop elements a kernel runs on one thread
            (an OpenMP fork costs more than it saves on small tensors).
        extra_flags: More compiler flags.
    """

    compiler: str = field(default_factory=env.c_compiler)
    opt_level: int = 3
    march: str = "native"
    vector_width: int = 512
    parallel_min_elements: int = 65536
    extra_flags: tuple[str, ...] = ()

    def flags(self) -> list[str]:
        out = [f"-O{self.opt_level}", "-fPIC", "-shared", "-fopenmp", "-std=gnu11"]
        out += ["-fno-math-errno", "-fno-trapping-math"]
        if self.march:
            out.append(f"-march={self.march}")
        if self.vector_width:
            out.append(f"-mprefer-vector-width={self.vector_width}")
        out += list(self.extra_flags)
        return out

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompiledLibrary:
    """A built library: where it is and what it holds."""

    path: str
    source_path: str
    key: str
    kernels: tuple[Kernel, ...]
    options: CodegenOptions
    from_cache: bool
    compile_s: float


def _writable(root: Path) -> bool:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(root, os.W_OK)


def cache_root() -> Path:
    base = env.cache_dir()
    root = Path(base) if base else Path.home() / ".cache" / "graph-autofusion"
    return root / "kernels"


@functools.lru_cache(maxsize=8)
def compiler_version(compiler: str) -> str:
    """The compiler's first ``--version`` line (part of the cache key)."""
    exe = shutil.which(shlex.split(compiler)[0]) if compiler else None
    if exe is None:
        raise CompilerNotFoundError(
            f"no C compiler {compiler!r} on PATH: install gcc (Debian: apt-get install gcc "
            f"libc6-dev libgomp1) or set CC; or allow the NumPy reference backend "
            f"(backend='reference')"
        )
    out = subprocess.run([*shlex.split(compiler), "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else compiler


def compile_library(
    kernels: Sequence[Kernel],
    options: CodegenOptions | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> CompiledLibrary:
    """Compile ``kernels`` into one shared library (or take it from the cache).

    Raises:
        CompilerNotFoundError: no C compiler.
        KernelCompileError: the compiler failed (source path, stderr, repro command).
    """
    options = options or CodegenOptions()
    source = library_source(kernels, parallel_min_elements=options.parallel_min_elements)
    built = compile_source(source, options, cache_dir=cache_dir, what=f"{len(kernels)} kernel(s)")
    return CompiledLibrary(
        built.path,
        built.source_path,
        built.key,
        tuple(kernels),
        options,
        built.from_cache,
        built.compile_s,
    )


@dataclass(frozen=True)
class BuiltSource:
    """A C translation unit built into a shared library (or found in the cache)."""

    path: str
    source_path: str
    key: str
    from_cache: bool
    compile_s: float


def compile_source(
    source: str,
    options: CodegenOptions | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    what: str = "kernels",
) -> BuiltSource:
    """Compile one C source into a shared library, cached by the source, the options and the
    compiler's version; written to a temporary name and renamed into place, so a concurrent
    reader never sees half a file.

    Raises:
        CompilerNotFoundError: no C compiler.
        KernelCompileError: the compiler failed (source path, stderr, repro command).
    """
    import time

    options = options or CodegenOptions()
    version = compiler_version(options.compiler)
    key = hashlib.sha256("\0".join([source, options.digest(), version]).encode()).hexdigest()[:24]
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    if cache_dir is None and not _writable(root):  # a read-only home: a private temp cache
        root = Path(tempfile.gettempdir()) / f"graph-autofusion-kernels-{os.getuid()}"
    entry = root / key
    lib, src = entry / "kernels.so", entry / "kernels.c"
    if lib.exists() and src.exists():
        return BuiltSource(str(lib), str(src), key, True, 0.0)
    entry.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    # The source first (same key, same bytes: a concurrent writer replaces it with itself),
    # then the library under a private name, renamed into place once the linker is done.
    # gcc runs in the entry folder on the relative name, so the library records "kernels.c",
    # not a temporary or cache path: the same source gives the same bytes in any cache.
    write_atomic(src, source)
    fd, tmp_lib = tempfile.mkstemp(prefix=".kernels-", suffix=".so", dir=entry)
    os.close(fd)
    tail = ["-lmvec", "-lm"]
    cmd = [*shlex.split(options.compiler), *options.flags(), src.name, "-o", tmp_lib, *tail]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=entry)
        if proc.returncode != 0:
            kept = str(entry / "failed.c")
            write_atomic(kept, source)
            repro = " ".join(
                shlex.quote(c) for c in [*cmd[:-5], kept, "-o", "/tmp/kernels.so", *tail]
            )
            raise KernelCompileError(
                f"{options.compiler} failed on {what}", kept, proc.stderr, repro
            )
        os.replace(tmp_lib, lib)
    finally:
        if os.path.exists(tmp_lib):
            os.unlink(tmp_lib)
    return BuiltSource(str(lib), str(src), key, False, time.perf_counter() - t)


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and
    ``os.replace``: a reader sees the old file or the whole new one, never a part; the file's
    mode is a plain ``open``'s (:func:`graph_autofusion.files.temp_beside`)."""
    path = Path(path)
    fd, tmp = temp_beside(path, prefix=f".{path.stem}-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

"""The environment variables the package reads, in one place (standard library only: every
layer may read them). Each is read when asked, so a change made at run time (a test's
``monkeypatch.setenv``) is seen.

| variable | what it sets |
|---|---|
| ``GRAPH_AUTOFUSION_CACHE`` | the cache folder: compiled kernels under ``kernels/``, and the test zoo's exports |
| ``GRAPH_AUTOFUSION_HARDWARE_DIR`` | the folder of the calibrated host profile and of user profiles found by name |
| ``GRAPH_AUTOFUSION_NO_SHIM`` | any value: kernels are called through ctypes, not the C call shim |
| ``GRAPH_AUTOFUSION_ORT_INCLUDE`` | onnxruntime's C API headers for the custom-operator library (empty: none) |
| ``GRAPH_AUTOFUSION_CUSTOM_OP_CFLAGS`` | more compiler flags for the custom-operator library |
| ``CC`` | the C compiler (default ``cc``) |
| ``CHROMIUM`` | the browser of the HTML report's browser test |
| ``HF_HUB_OFFLINE`` | set to 1 (if unset) before the test zoo loads a tokenizer or weights |
"""

from __future__ import annotations

import os
import shlex

CACHE = "GRAPH_AUTOFUSION_CACHE"
HARDWARE_DIR = "GRAPH_AUTOFUSION_HARDWARE_DIR"
NO_SHIM = "GRAPH_AUTOFUSION_NO_SHIM"
ORT_INCLUDE = "GRAPH_AUTOFUSION_ORT_INCLUDE"
CUSTOM_OP_CFLAGS = "GRAPH_AUTOFUSION_CUSTOM_OP_CFLAGS"


def cache_dir() -> str | None:
    """``$GRAPH_AUTOFUSION_CACHE`` (None when unset or empty)."""
    return os.environ.get(CACHE) or None


def hardware_dir() -> str | None:
    """``$GRAPH_AUTOFUSION_HARDWARE_DIR`` (None when unset or empty)."""
    return os.environ.get(HARDWARE_DIR) or None


def shim_disabled() -> bool:
    return bool(os.environ.get(NO_SHIM))


def ort_include() -> str | None:
    """``$GRAPH_AUTOFUSION_ORT_INCLUDE``: None when unset, ``""`` when set empty (no headers)."""
    return os.environ.get(ORT_INCLUDE)


def custom_op_cflags() -> tuple[str, ...]:
    return tuple(os.environ.get(CUSTOM_OP_CFLAGS, "").split())


def c_compiler() -> str:
    """``$CC`` as written (default ``cc``)."""
    return os.environ.get("CC", "cc")


def c_compiler_argv() -> list[str]:
    """``$CC`` split into a command's words (``CC="ccache gcc"`` works)."""
    return shlex.split(c_compiler())


def chromium() -> str | None:
    return os.environ.get("CHROMIUM") or None


def hub_offline() -> None:
    """Hugging Face loads from local files only (set unless the user set it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

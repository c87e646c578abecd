"""A CPython-extension call shim for generated kernels (optional, faster than ctypes).

    shim = load_shim()            # None when it cannot be built (no Python.h): ctypes is used
    shim.call(fn_addr, sizes_addr, strides_addr, threads, offsets_addr, tensor, ...)

One generic module, compiled once per interpreter and cached like the kernels. It takes the
tensors themselves and reads their data pointers through the hook Inductor's own bindings use
(``torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr``, private: when it is
missing the shim is not used), adds each operand's byte offset (``offsets_addr``: an int64
array), and calls the kernel. Measured against ctypes in ``docs/codegen.md``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from graph_autofusion import env
from graph_autofusion.codegen.compiler import cache_root

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef void (*kernel_fn)(const int64_t *, void *const *, const int64_t *, int64_t);
static void *(*tensor_data_ptr)(PyObject *) = NULL;

static PyObject *gaf_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 5 || nargs - 5 > 64) {
        PyErr_SetString(PyExc_TypeError, "gaf_call(fn, sizes, strides, threads, offsets, *tensors)");
        return NULL;
    }
    kernel_fn fn = (kernel_fn)PyLong_AsVoidPtr(args[0]);
    const int64_t *sizes = (const int64_t *)PyLong_AsVoidPtr(args[1]);
    const int64_t *strides = (const int64_t *)PyLong_AsVoidPtr(args[2]);
    int64_t threads = PyLong_AsLongLong(args[3]);
    const int64_t *offsets = (const int64_t *)PyLong_AsVoidPtr(args[4]);
    if (PyErr_Occurred()) return NULL;
    void *ptrs[64];
    for (Py_ssize_t i = 5; i < nargs; i++)
        ptrs[i - 5] = (char *)tensor_data_ptr(args[i]) + offsets[i - 5];
    Py_BEGIN_ALLOW_THREADS
    fn(sizes, ptrs, strides, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *gaf_init(PyObject *self, PyObject *arg) {
    tensor_data_ptr = (void *(*)(PyObject *))PyLong_AsVoidPtr(arg);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))gaf_call, METH_FASTCALL, "call a generated kernel"},
    {"init", gaf_init, METH_O, "set the tensor data-pointer hook"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gaf_shim", NULL, -1, methods};

PyMODINIT_FUNC PyInit_gaf_shim(void) { return PyModule_Create(&module); }
"""


@functools.lru_cache(maxsize=1)
def load_shim() -> Any:
    """The compiled shim module, or ``None`` (no hook, no headers, no compiler, no writable
    cache): the callers use ctypes then."""
    try:
        return _load_shim()
    except (OSError, ImportError):
        return None


def _load_shim() -> Any:
    if env.shim_disabled():
        return None
    try:
        import torch

        hook = int(torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)
    except (ImportError, AttributeError, TypeError):
        return None
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return None

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha256((SOURCE + include + suffix).encode()).hexdigest()[:16]
    folder = cache_root().parent / "shim" / key
    path = folder / f"gaf_shim{suffix}"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, src = tempfile.mkstemp(prefix=".shim-", suffix=".c", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(SOURCE)
        tmp = src[:-2] + suffix
        cc = env.c_compiler_argv()
        cmd = [*cc, "-O2", "-shared", "-fPIC", f"-I{include}", src, "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        os.unlink(src)
        if proc.returncode != 0:
            return None
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location("gaf_shim", Path(path))
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.init(hook)
    return mod

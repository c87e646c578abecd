"""C for onnxruntime custom operators around generated kernels (the onnxruntime target).

    source = customop_library_source(kernels)   # kernels + one OrtCustomOp per kernel

Each kernel (:mod:`graph_autofusion.codegen.c_backend`) gets a descriptor table and one
``OrtCustomOp`` in the ``ai.graph_autofusion`` domain, named by the kernel's structure digest
(``Gaf_<digest>``: identical groups share one operator). ``RegisterCustomOps`` adds them all,
so one library serves a whole model.

A call does at run time, from the input shapes onnxruntime passes, what
:mod:`graph_autofusion.runtime.kernels` does for the cpu target: the inputs' views (strided,
no copy), the loop shape (NumPy broadcasting, the group's constant ``Expand`` shapes, a
``Concat``'s branch lengths), the output shapes (reduced axes kept or dropped, the rank the
graph declares, an output ``Reshape``), every operand's strides over the loop with contiguous
axes merged, and the fast variant when every innermost stride is the one compiled in. Shapes
the kernel cannot serve (broadcast mismatch, a rank wider than the kernel's, a ``Reshape`` of
a strided view) fail the call with an onnxruntime error naming the operator, never a wrong
result.

Threads: the kernels are compiled with ``-fopenmp-simd`` (the SIMD pragmas, no OpenMP
runtime), and a large call is split along one outer axis into chunks run by onnxruntime's own
intra-op thread pool (``KernelContext_ParallelFor``); a second thread pool inside onnxruntime
gives erratic timings.
"""

from __future__ import annotations

from collections.abc import Sequence

from graph_autofusion.codegen import ort_gelu, ort_gemv, ort_gemv_f16, ort_gemv_q
from graph_autofusion.codegen.c_backend import library_source
from graph_autofusion.codegen.kernel_ir import ROW, Kernel
from graph_autofusion.codegen.ort_customop_prelude import PRELUDE

__all__ = [
    "DOMAIN",
    "ELEM_SIZE",
    "MAX_DIMS",
    "MAX_OPERANDS",
    "ONNX_TYPE",
    "PARALLEL_MIN",
    "PRELUDE",
    "SHAPE_ONLY",
    "VIEW_CODE",
    "customop_library_source",
    "op_name",
    "wrapper_refusal",
]


DOMAIN = "ai.graph_autofusion"


#: ONNX TensorProto element types of the kernels' storage dtypes.
ONNX_TYPE = {
    "f32": 1,
    "u8": 2,
    "i8": 3,
    "i32": 6,
    "i64": 7,
    "bool": 9,
    "f16": 10,
    "f64": 11,
    "bf16": 16,
}


ELEM_SIZE = {
    "f32": 4,
    "u8": 1,
    "i8": 1,
    "i32": 4,
    "i64": 8,
    "bool": 1,
    "f16": 2,
    "f64": 8,
    "bf16": 2,
}


VIEW_CODE = {
    "transpose": 1,
    "reshape": 2,
    "flatten": 3,
    "unsqueeze": 4,
    "squeeze": 5,
    "slice": 6,
    "select": 7,
}


#: Output views that only rename the shape of a contiguous tensor.
SHAPE_ONLY = {"reshape", "flatten", "squeeze", "unsqueeze"}


MAX_DIMS = 12


MAX_OPERANDS = 64


#: Elements below which a call runs on the calling thread only.
PARALLEL_MIN = 32768


def op_name(kernel: Kernel) -> str:
    """The custom operator of a kernel: named by its structure digest."""
    return f"Gaf_{kernel.digest()}"


def wrapper_refusal(kernel: Kernel) -> str | None:
    """Why the custom-operator wrapper cannot call ``kernel`` (``None``: it can)."""
    if kernel.rank > MAX_DIMS:
        return f"rank {kernel.rank} above the wrapper's {MAX_DIMS}"
    if len(kernel.inputs) + len(kernel.outputs) > MAX_OPERANDS:
        return f"more than {MAX_OPERANDS} operands"
    for i in kernel.inputs:
        if i.dtype not in ONNX_TYPE:
            return f"input dtype {i.dtype}"
        strided = False
        for v in i.views:
            if v.op not in VIEW_CODE:
                return f"input view {v.op}"
            if v.op in ("reshape", "flatten") and strided:
                return f"a {v.op} of a transposed or sliced view of {i.name!r} needs a copy"
            if v.op in ("transpose", "slice", "select"):
                strided = True
            if v.op == "slice" and any(int(s[3]) <= 0 for s in v.args):
                return "a slice with a negative step"
    for o in kernel.outputs:
        if o.dtype not in ONNX_TYPE:
            return f"output dtype {o.dtype}"
        bad = [v.op for v in o.views if v.op not in SHAPE_ONLY]
        if bad:
            return f"output view {bad[0]} of {o.name!r} (the output would be strided)"
    return None


def _ints(values: Sequence[int]) -> str:
    return ", ".join(f"INT64_C({int(v)})" for v in values) if values else "0"


def _small(values: Sequence[int]) -> str:
    return ", ".join(str(int(v)) for v in values) if values else "0"


def _view_program(views: Sequence) -> list[int]:
    prog: list[int] = [len(views)]
    for v in views:
        if v.op == "slice":
            args = [int(x) for spec in v.args for x in spec]
        else:
            args = [int(x) for x in v.args]
        if v.op == "unsqueeze":
            args = sorted(args)
        prog += [VIEW_CODE[v.op], len(args), *args]
    return prog


def _descriptor(k: Kernel) -> str:
    name = op_name(k)
    p = f"gaf_d_{k.digest()}"
    lines = []
    in_views = []
    for i, inp in enumerate(k.inputs):
        if inp.views:
            lines.append(
                f"static const int64_t {p}_iv{i}[] = {{{_ints(_view_program(inp.views))}}};"
            )
            in_views.append(f"{p}_iv{i}")
        else:
            in_views.append("0")
    out_views = []
    for j, o in enumerate(k.outputs):
        if o.views:
            lines.append(f"static const int64_t {p}_ov{j}[] = {{{_ints(_view_program(o.views))}}};")
            out_views.append(f"{p}_ov{j}")
        else:
            out_views.append("0")
    srcs = []
    for s, shape in enumerate(k.shape_sources):
        lines.append(f"static const int64_t {p}_src{s}[] = {{{_ints([len(shape), *shape])}}};")
        srcs.append(f"{p}_src{s}")
    lines.append(f"static const int64_t *const {p}_ivs[] = {{{', '.join(in_views)}}};")
    lines.append(f"static const int64_t *const {p}_ovs[] = {{{', '.join(out_views)}}};")
    lines.append(f"static const int64_t *const {p}_srcs[] = {{{', '.join(srcs) or '0'}}};")
    arrays = {
        "red": list(k.reduce_axes),
        "in_type": [ONNX_TYPE[i.dtype] for i in k.inputs],
        "in_esize": [ELEM_SIZE[i.dtype] for i in k.inputs],
        "in_branch": [i.branch[1] if i.branch is not None else -1 for i in k.inputs],
        "out_type": [ONNX_TYPE[o.dtype] for o in k.outputs],
        "out_esize": [ELEM_SIZE[o.dtype] for o in k.outputs],
        "out_row": [1 if o.level == ROW else 0 for o in k.outputs],
        "out_keep": [1 if o.keepdims else 0 for o in k.outputs],
        "out_rank": [o.rank for o in k.outputs],
        "inner": list(k.inner_classes),
    }
    for field, vals in arrays.items():
        lines.append(f"static const int {p}_{field}[] = {{{_small(vals)}}};")
    nbranch = len(k.concat[1]) if k.concat is not None else 0
    fast = k.name if k.inner_classes else "0"
    lines.append(
        f'static const GafDesc {p} = {{"{name}", {fast}, {k.name}_g, {k.rank}, '
        f"{len(k.reduce_axes)}, {len(k.inputs)}, {len(k.outputs)}, {nbranch}, {p}_red, "
        f"{p}_in_type, {p}_in_esize, {p}_in_branch, {p}_ivs, {p}_out_type, {p}_out_esize, "
        f"{p}_out_row, {p}_out_keep, {p}_out_rank, {p}_ovs, {len(k.shape_sources)}, {p}_srcs, "
        f"{p + '_inner' if k.inner_classes else '0'}}};"
    )
    return "\n".join(lines)


def customop_library_source(
    kernels: Sequence[Kernel], *, parallel_min_elements: int = PARALLEL_MIN, gemv: bool = False
) -> str:
    """One translation unit: the kernels, their descriptors and ``RegisterCustomOps``.

    ``kernels`` are finalized (named ``gaf_<digest>``, inner stride classes set) and distinct.
    ``gemv``: the library also defines the few-row ``Gemv`` operator and its fp16- and
    8/4-bit-weight twins ``GemvF16`` and ``GemvQ`` (:mod:`graph_autofusion.codegen.ort_gemv`,
    :mod:`~graph_autofusion.codegen.ort_gemv_f16`, :mod:`~graph_autofusion.codegen.ort_gemv_q`),
    and the one-pass GELUs ``GeluErf`` and ``GeluTanh`` (:mod:`~graph_autofusion.codegen.ort_gelu`).
    """

    unique = list({op_name(k): k for k in kernels}.values())
    parts = [
        library_source(unique, parallel_min_elements=1 << 62),
        f"#define GAF_PARALLEL_MIN {int(parallel_min_elements)}",
        PRELUDE,
    ]
    if gemv:
        parts += [ort_gemv.SOURCE, ort_gemv_f16.SOURCE, ort_gemv_q.SOURCE, ort_gelu.SOURCE]
    parts += [_descriptor(k) for k in unique]
    descs = ", ".join(f"&gaf_d_{k.digest()}" for k in unique)
    parts.append(
        f"static const GafDesc *const gaf_all[] = {{{descs or '0'}}};\n"
        f"static GafOp gaf_ops[{max(1, len(unique))}];\n"
        f"#define GAF_NOPS {len(unique)}\n"
        f"#define GAF_GEMV {1 if gemv else 0}\n"
        "static int gaf_filled;\n"
        r"""
__attribute__((visibility("default")))
OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    OrtCustomOpDomain *domain = 0; OrtStatus *err;
    gaf_api = base->GetApi(ORT_API_VERSION);
    if (!gaf_api) return 0;
    if ((err = gaf_api->CreateCustomOpDomain("""
        + f'"{DOMAIN}"'
        + r""", &domain))) return err;
    if (!__atomic_load_n(&gaf_filled, __ATOMIC_ACQUIRE)) { /* once: live sessions use them */
        for (int i = 0; i < GAF_NOPS; i++) gaf_fill(&gaf_ops[i], gaf_all[i]);
#if GAF_GEMV
        gaf_gemv_fill(&gaf_gemv_op);
        gaf_gemv_f16_fill(&gaf_gemv_f16_op);
        gaf_gemv_q_fill(&gaf_gemv_q_op);
        gaf_gelu_fill(&gaf_gelu_erf_op, 0);
        gaf_gelu_fill(&gaf_gelu_tanh_op, 1);
#endif
        __atomic_store_n(&gaf_filled, 1, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < GAF_NOPS; i++)
        if ((err = gaf_api->CustomOpDomain_Add(domain, &gaf_ops[i].op))) return err;
#if GAF_GEMV
    if ((err = gaf_api->CustomOpDomain_Add(domain, &gaf_gemv_op))) return err;
    if ((err = gaf_api->CustomOpDomain_Add(domain, &gaf_gemv_f16_op))) return err;
    if ((err = gaf_api->CustomOpDomain_Add(domain, &gaf_gemv_q_op))) return err;
    if ((err = gaf_api->CustomOpDomain_Add(domain, &gaf_gelu_erf_op))) return err;
    if ((err = gaf_api->CustomOpDomain_Add(domain, &gaf_gelu_tanh_op))) return err;
#endif
    return gaf_api->AddCustomOpDomain(options, domain);
}
"""
    )
    return "\n\n".join(parts) + "\n"

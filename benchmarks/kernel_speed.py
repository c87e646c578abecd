"""Generated kernels against torch eager, torch.compile (Inductor) and onnxruntime's contrib
kernels, side by side in one run.

Run: ``.venv/bin/python benchmarks/kernel_speed.py [--runs N] [--quick] [--out DIR]`` (writes
``kernels.json`` and ``kernels.md`` to ``DIR``, by default ``benchmarks/results/``, and prints
the table).

* Streaming bandwidth of this machine, 256 MB, 2 threads: copy and triad, run as generated
  kernels and as torch ops.
* Six fusion patterns at 64 MB (fp32, 4096 rows of 4096) and at decode sizes (1x512, 1x4096,
  8x128x64): LayerNorm with residual Add, RMSNorm, bias+GELU (erf), scale+mask+Softmax, SwiGLU,
  rotary embedding. For each: our kernel (called through the runtime's cached call path, as a
  fused model calls it), torch eager's unfused operators, ``torch.compile``'s Inductor kernel for
  the same function (``dynamic=False``), and onnxruntime's contrib kernel where one exists
  (``SkipLayerNormalization``, ``SimplifiedLayerNormalization``, ``BiasGelu``,
  ``RotaryEmbedding``), run through ``InferenceSession.run``.
* One allocation policy for every side: each writes its result into an output allocated once
  before timing. Ours: the runtime's output pool (the same buffer every call once the caller
  drops the result, as a fused model runs it); eager: its last operator with ``out=`` (its
  intermediates allocate, as unfused eager does); Inductor: ``torch.compile`` of
  ``out.copy_(f(...))``, whose kernel stores into ``out``; onnxruntime: IO binding of the output
  to the preallocated buffer. Each side's output is checked against eager's before timing.
* Every configuration is timed round-robin (median of ``--runs`` after warm-up) with 2 threads,
  each round in its own seeded shuffled order (``runtime.timing.round_robin(rotate=True)``).
  At 64 MB the achieved bandwidth (bytes the fused function must move / time) is compared with
  a 64 MB triad timed in the same round-robin (this machine's bandwidth moves between ~37 and
  ~60 GB/s within minutes, so a triad measured apart is no reference). At decode sizes the fixed cost of a call (its time on a 1-element row) is
  reported for ours and Inductor's.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from graph_autofusion.codegen.compiler import compile_library
from graph_autofusion.codegen.kernel_ir import Instr, Kernel, KernelInput, KernelOutput
from graph_autofusion.codegen.lower import KernelRefused, lower_group
from graph_autofusion.ir.text import parse_model
from graph_autofusion.pipeline.cpu import finalize_kernel
from graph_autofusion.runtime.kernels import load_library
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.timing import round_robin
from graph_autofusion.runtime.torch_runtime import infer_shapes

OUT = Path(__file__).parent / "results"
THREADS = 2


# the patterns as ONNX operators (what the exporters write) and as torch functions
def _rotate_half(x):
    return torch.cat([-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]], -1)


PATTERNS = {
    "layernorm_residual": (
        "%s = Add(%x, %r)\n  %y = LayerNormalization<axis=-1, epsilon=1e-5>(%s, %g, %b)",
        ["x", "r"],
        ["g", "b"],
        lambda x, r, g, b: torch.nn.functional.layer_norm(x + r, (x.shape[-1],), g, b, 1e-5),
    ),
    "rmsnorm": (
        "%p = Mul(%x, %x)\n  %m = ReduceMean<axes=[-1], keepdims=1>(%p)\n  %a = Add(%m, %eps)\n"
        "  %q = Sqrt(%a)\n  %n = Div(%x, %q)\n  %y = Mul(%n, %g)",
        ["x"],
        ["g"],
        lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g,
    ),
    "bias_gelu": (
        "%h = Add(%x, %b)\n  %y = Gelu(%h)",
        ["x"],
        ["b"],
        lambda x, b: torch.nn.functional.gelu(x + b),
    ),
    "scale_mask_softmax": (
        "%d = Mul(%x, %scale)\n  %a = Add(%d, %mask)\n  %y = Softmax<axis=-1>(%a)",
        ["x", "mask"],
        [],
        lambda x, mask: torch.softmax(x * 0.125 + mask, -1),
    ),
    "swiglu": (
        "%s = Sigmoid(%x)\n  %t = Mul(%x, %s)\n  %y = Mul(%t, %u)",
        ["x", "u"],
        [],
        lambda x, u: torch.nn.functional.silu(x) * u,
    ),
    "rotary": (
        "%x1 = Slice(%x, %zero, %half, %last)\n  %x2 = Slice(%x, %half, %big, %last)\n"
        "  %n2 = Neg(%x2)\n  %rot = Concat<axis=-1>(%n2, %x1)\n  %a = Mul(%x, %cos)\n"
        "  %c = Mul(%rot, %sin)\n  %y = Add(%a, %c)",
        ["x", "cos", "sin"],
        [],
        lambda x, cos, sin: x * cos + _rotate_half(x) * sin,
    ),
}


def _layernorm_into():
    mean, rstd = torch.empty(0), torch.empty(0)  # sized by the first call, reused after

    def f(out, x, r, g, b):
        torch.ops.aten.native_layer_norm.out(
            x + r, [x.shape[-1]], g, b, 1e-5, out0=out, out1=mean, out2=rstd
        )
        return out

    return f


#: eager's unfused operators with the last one writing into ``out`` (a factory per call site)
EAGER_INTO: dict[str, Callable[[], Callable]] = {
    "layernorm_residual": _layernorm_into,
    "rmsnorm": lambda: (
        lambda out, x, g: torch.mul(
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), g, out=out
        )
    ),
    "bias_gelu": lambda: lambda out, x, b: torch.ops.aten.gelu.out(x + b, out=out),
    "scale_mask_softmax": lambda: (
        lambda out, x, mask: torch.ops.aten._softmax.out(x * 0.125 + mask, -1, False, out=out)
    ),
    "swiglu": lambda: lambda out, x, u: torch.mul(torch.nn.functional.silu(x), u, out=out),
    "rotary": lambda: lambda out, x, cos, sin: torch.add(x * cos, _rotate_half(x) * sin, out=out),
}
SIZES = {"64MB": (4096, 4096), "1x512": (1, 512), "1x4096": (1, 4096), "8x128x64": (8, 128, 64)}


def _shape_of(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if name == "mask":
        return (1,) * (len(shape) - 1) + (shape[-1],)
    return shape


def _inputs(pattern: str, shape: tuple[int, ...]) -> list[torch.Tensor]:
    _, acts, params, _ = PATTERNS[pattern]
    gen = torch.Generator().manual_seed(0)
    out = [torch.randn(_shape_of(a, shape), generator=gen) for a in acts]
    out += [torch.randn(shape[-1], generator=gen) for _ in params]
    return out


def _graph(pattern: str, shape: tuple[int, ...]) -> str:
    body, acts, params, _ = PATTERNS[pattern]
    ins = ", ".join(f"%{a}: f32[{','.join(str(d) for d in _shape_of(a, shape))}]" for a in acts)
    ins += "".join(f", %{p}: f32[{shape[-1]}]" for p in params)
    consts = (
        "  init %eps: f32[] = [1e-6]\n  init %scale: f32[] = [0.125]\n"
        f"  init %zero: i64[1] = [0]\n  init %half: i64[1] = [{shape[-1] // 2}]\n"
        "  init %big: i64[1] = [1000000000]\n  init %last: i64[1] = [-1]\n"
    )
    return f"graph {pattern}({ins}) -> (%y) {{\n{consts}  {body}\n}}"


def our_kernel(pattern: str, shape: tuple[int, ...]):
    """Our compiled kernel for the pattern (None, with the reason, when it is not lowered)."""
    model = parse_model('model opset {"": 20}\n' + _graph(pattern, shape))
    infer_shapes(model)
    g = model.graph
    try:
        low = lower_group(g.nodes, list(g.outputs), None, opset=20)
    except KernelRefused as e:
        return None, f"{e.code}: {e.message}"
    ins = {v.name: tuple(v.shape) for v in g.inputs}
    ins.update({k: tuple(v.const.shape) for k, v in g.initializers.items()})
    k = finalize_kernel(low.kernel, [ins[i.name] for i in low.kernel.inputs])
    fn = load_library(compile_library([k]), THREADS).kernel(k.name)
    names = [v.name for v in g.inputs]
    order = [names.index(i.name) for i in k.inputs]
    return (lambda *xs: fn(*[xs[i] for i in order])), k.signature()


def ort_kernel(pattern: str, shape: tuple[int, ...]):
    """onnxruntime's contrib kernel for the pattern, or None."""
    from onnx import TensorProto, helper

    n = shape[-1]
    f = TensorProto.FLOAT
    vi = lambda name, s: helper.make_tensor_value_info(name, f, list(s))  # noqa: E731
    ms = "com.microsoft"
    if pattern == "layernorm_residual":
        node = helper.make_node(
            "SkipLayerNormalization", ["x", "r", "g", "b"], ["y"], domain=ms, epsilon=1e-5
        )
        inputs = [vi("x", shape), vi("r", shape), vi("g", (n,)), vi("b", (n,))]
    elif pattern == "rmsnorm":
        node = helper.make_node(
            "SimplifiedLayerNormalization", ["x", "g"], ["y"], epsilon=1e-6, axis=-1
        )
        inputs = [vi("x", shape), vi("g", (n,))]
    elif pattern == "bias_gelu":
        node = helper.make_node("BiasGelu", ["x", "b"], ["y"], domain=ms)
        inputs = [vi("x", shape), vi("b", (n,))]
    else:
        return None
    graph = helper.make_graph([node], pattern, inputs, [vi("y", shape)])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    )
    # no spinning: an idle onnxruntime pool spinning on both cores would slow whatever runs
    # next in the round-robin
    sess = ort_session(model, "all", THREADS)
    names = [i.name for i in inputs]
    io = sess.io_binding()

    def run(out, *xs):  # the output bound to the caller's buffer: no allocation per call
        for k, x in zip(names, xs):
            io.bind_cpu_input(k, x.numpy())
        io.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.data_ptr())
        sess.run_with_iobinding(io)
        return out

    return run


def inductor(pattern: str):
    """``torch.compile`` of the pattern's function writing into ``out`` (Inductor stores its
    result into ``out`` itself: the copy is fused into its kernel)."""
    fn = PATTERNS[pattern][3]

    def into(out, *xs):
        return out.copy_(fn(*xs))

    return torch.compile(into, dynamic=False)


def into_sides(pattern: str, shape: tuple[int, ...], xs: list, contrib: bool) -> tuple[dict, str]:
    """The configurations of one row as calls without arguments, each writing into an output
    allocated here once (ours: the runtime's output pool), each checked against eager's
    allocating function first; and our kernel's signature (or why it was not lowered)."""
    want = PATTERNS[pattern][3](*xs)
    into: dict[str, Callable] = {"eager": EAGER_INTO[pattern](), "inductor": inductor(pattern)}
    ours, sig = our_kernel(pattern, shape)
    if ours is not None:
        into["ours"] = lambda out, *a: ours(*a)[0]
    ort = ort_kernel(pattern, shape) if contrib else None
    if ort is not None:
        into["ort_contrib"] = ort
    sides = {}
    for name, f in into.items():
        out = torch.empty_like(want)
        with torch.no_grad():  # as timed (Inductor's guards include the grad mode)
            got = f(out, *xs)
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4, msg=name)
        sides[name] = lambda f=f, out=out: f(out, *xs)
    return sides, sig


def time_round_robin(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median microseconds of each call, 3 warm-up calls each, then ``runs`` rounds in a
    seeded shuffled order (``runtime.timing.round_robin(rotate=True)``)."""
    times = round_robin(fns, runs, warmup=3, rotate=True)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def _stream_kernels():
    copy = Kernel(
        "bw_copy", 1, (), (KernelInput("a", "f32"),), (KernelOutput("c", "f32", 0, rank=1),),
        (Instr("load", (), (("input", 0),)),), inner_classes=(1, 1),
    )  # fmt: skip
    triad = Kernel(
        "bw_triad", 1, (), (KernelInput("a", "f32"), KernelInput("b", "f32")),
        (KernelOutput("c", "f32", 4, rank=1),),
        (Instr("load", (), (("input", 0),)), Instr("load", (), (("input", 1),)),
         Instr("const", (), (("value", 3.0),)), Instr("mul", (1, 2)), Instr("add", (0, 3))),
        inner_classes=(1, 1, 1),
    )  # fmt: skip
    return load_library(compile_library([copy, triad]), THREADS)


def our_triad():
    return _stream_kernels().kernel("bw_triad")


def bandwidth(runs: int) -> dict[str, float]:
    """Copy and triad over 256 MB with 2 threads: generated kernels and torch ops."""
    n = 256 * 2**20 // 4  # 256 MB arrays
    lib = _stream_kernels()
    a, b = torch.randn(n), torch.randn(n)
    out = torch.empty(n)
    t = time_round_robin(
        {
            "copy_ours": lambda: lib.kernel("bw_copy")(a),
            "triad_ours": lambda: lib.kernel("bw_triad")(a, b),
            "copy_torch": lambda: out.copy_(a),
            "triad_torch": lambda: torch.add(a, b, alpha=3.0, out=out),
        },
        runs,
    )
    gb = {"copy": 2 * 4 * n / 1e9, "triad": 3 * 4 * n / 1e9}
    return {k: gb[k.split("_")[0]] / (v * 1e-6) for k, v in t.items()}


def compile_times() -> dict[str, float]:
    """A batch of 30 kernels (random groups of 2-12 operators) compiled into a fresh cache,
    then taken from it."""
    import tempfile

    from graph_autofusion.testing.fused_groups import RngChooser, random_group

    kernels = []
    for seed in range(30):
        g = random_group(RngChooser(1000 + seed), name=f"c{seed}")
        low = lower_group(g.nodes, g.outputs, None, opset=20)
        shapes = [g.feeds[i.name].shape for i in low.kernel.inputs]
        kernels.append(finalize_kernel(low.kernel, shapes))
    kernels = list({k.name: k for k in kernels}.values())
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        compile_library(kernels, cache_dir=cache)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        lib = compile_library(kernels, cache_dir=cache)
        warm = time.perf_counter() - t
        assert lib.from_cache
    return {"kernels": len(kernels), "cold_s": cold, "cached_s": warm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="decode sizes only, 10 runs")
    ap.add_argument("--out", type=Path, default=OUT, help="folder for kernels.json and .md")
    args = ap.parse_args(argv)
    torch.set_num_threads(THREADS)
    # one compiled function (``inductor``'s ``into``) per pattern and shape: 6 x 7
    torch._dynamo.config.recompile_limit = 64
    runs = 10 if args.quick else args.runs
    compiled = compile_times()
    print(f"compile: {compiled}", flush=True)
    bw = bandwidth(max(5, runs // 3))
    triad_lib = our_triad()
    ta, tb = torch.randn(16 * 2**20), torch.randn(16 * 2**20)

    def triad_64mb():
        return triad_lib(ta, tb)

    rows = []
    sizes = {k: v for k, v in SIZES.items() if not (args.quick and k == "64MB")}
    for pattern in PATTERNS:
        for size_name, shape in sizes.items():
            xs = _inputs(pattern, shape)
            fns, sig = into_sides(pattern, shape, xs, contrib=True)
            if size_name == "64MB":  # the streaming reference, timed in the same round-robin
                fns["triad_64MB"] = triad_64mb
            with torch.no_grad():
                t = time_round_robin(fns, runs if size_name != "64MB" else max(5, runs // 3))
            moved = sum(x.numel() * 4 for x in xs) + int(np.prod(shape)) * 4
            row = {"pattern": pattern, "size": size_name, "shape": list(shape), "us": t,
                   "bytes": moved, "ours": sig}  # fmt: skip
            if size_name == "64MB":
                triad_us = t.pop("triad_64MB")
                row["triad_64MB_gb_s"] = 3 * 64 * 2**20 / (triad_us * 1e-6) / 1e9
                row["gb_s"] = {k: moved / (v * 1e-6) / 1e9 for k, v in t.items()}
                row["fraction_of_triad"] = {
                    k: g / row["triad_64MB_gb_s"] for k, g in row["gb_s"].items()
                }
            if size_name != "64MB":  # fixed cost: the same functions on a 1-element row
                tiny_shape = (1,) * (len(shape) - 1) + (4,)
                tiny = _inputs(pattern, tiny_shape)
                tf, _ = into_sides(pattern, tiny_shape, tiny, contrib=False)
                with torch.no_grad():
                    row["fixed_us"] = time_round_robin(tf, runs)
            rows.append(row)
            print(_line(row), flush=True)
    result = {
        "machine": platform.processor() or platform.machine(),
        "threads": THREADS,
        "torch": torch.__version__,
        "runs": runs,
        "bandwidth_gb_s": bw,
        "compile": compiled,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "kernels.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def _line(row: dict) -> str:
    t = row["us"]
    parts = [f"{k} {v:9.1f}" for k, v in t.items()]
    return f"{row['pattern']:<20} {row['size']:<9} " + "  ".join(parts)


def markdown(result: dict) -> str:
    bw = result["bandwidth_gb_s"]
    lines = [
        "# Generated kernels vs eager, Inductor and onnxruntime (`benchmarks/kernel_speed.py`)",
        "",
        f"torch {result['torch']}, {result['threads']} threads, median of {result['runs']} "
        "round-robin runs (64 MB rows: a third of them), each round in its own seeded shuffled "
        "order.",
        "",
        "Allocation: every side writes into an output allocated once before timing (ours: the "
        "runtime's output pool; eager: its last operator with `out=`; Inductor: "
        "`torch.compile` of `out.copy_(f(...))`, its kernel storing into `out`; onnxruntime: "
        "the output bound to the buffer by IO binding). Every side's output is checked against "
        "eager's first.",
        "",
        "Streaming bandwidth, 256 MB: "
        + ", ".join(f"{k.replace('_', ' ')} {v:.1f} GB/s" for k, v in bw.items()),
        "",
        "Compilation: {kernels} kernels in one library {cold_s:.2f} s cold, {cached_s:.4f} s from "
        "the cache.".format(**result["compile"]),
        "",
        "| pattern | size | ours us | eager us | inductor us | ort contrib us | ours/inductor | ours % of triad (64 MB, same round-robin) | fixed cost ours / inductor us |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        t = r["us"]
        ours = t.get("ours")
        frac = r.get("fraction_of_triad", {}).get("ours")
        fixed = r.get("fixed_us", {})
        lines.append(
            "| {p} | {s} | {o} | {e:.1f} | {i:.1f} | {c} | {ratio} | {f} | {fx} |".format(
                p=r["pattern"],
                s=r["size"],
                o=f"{ours:.1f}" if ours is not None else "not lowered",
                e=t["eager"],
                i=t["inductor"],
                c=f"{t['ort_contrib']:.1f}" if "ort_contrib" in t else "-",
                ratio=f"{ours / t['inductor']:.2f}" if ours is not None else "-",
                f=f"{100 * frac:.0f}%" if frac is not None else "",
                fx=(
                    f"{fixed['ours']:.1f} / {fixed['inductor']:.1f}"
                    if "ours" in fixed
                    else (f"- / {fixed['inductor']:.1f}" if fixed else "")
                ),
            )
        )
    not_lowered = {r["pattern"]: r["ours"] for r in result["rows"] if "ours" not in r["us"]}
    for p, why in not_lowered.items():
        lines.append(f"\n{p}: not lowered ({why})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

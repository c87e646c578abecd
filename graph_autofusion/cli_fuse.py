"""The command line's fuse, kernels, verify and bench commands, and the sample inputs they
read (``--inputs``): ``graph-autofusion fuse MODEL -o OUT`` and its kin (:mod:`graph_autofusion.
cli` builds the parser and dispatches).
"""

from __future__ import annotations

import argparse
import json
import sys

from graph_autofusion.cli_args import (
    check_input_file,
    check_output_path,
)


def progress_bar(total_hint: str):
    """A ``progress(stage, i, n)`` callback on the progress display (``None`` when quiet)."""
    from graph_autofusion.report import progress

    return progress.callback(total_hint)


def load_feeds(path: str | None):
    """The arrays of an ``--inputs`` .npz keyed by input name; a file that is not one raises
    :class:`~graph_autofusion.errors.SampleInputError` naming it."""
    if not path:
        return None
    import zipfile

    import numpy as np

    from graph_autofusion.cli_args import one_line
    from graph_autofusion.errors import SampleInputError

    check_input_file(path, "inputs file")
    how = "write one with numpy.savez(PATH, input_name=array, ...)"
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PK\x05\x06":  # the zip archive numpy.savez() writes with no arrays
        raise SampleInputError(f"{path}: the .npz holds no arrays; {how}")
    if magic != b"PK\x03\x04":  # an .npz is a zip archive
        raise SampleInputError(f"{path}: not an .npz file (no zip archive header); {how}")
    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                feeds = {k: data[k] for k in data.files}
        else:  # a zip archive numpy read as something else
            feeds = None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise SampleInputError(
            f"{path}: not a readable .npz of sample inputs ({one_line(e)}); {how}"
        ) from None
    if feeds is None:
        raise SampleInputError(f"{path}: not an .npz keyed by input name; {how}")
    if not feeds:
        raise SampleInputError(f"{path}: the .npz holds no arrays; {how}")
    return feeds


def check_feeds(model, feeds, path: str | None) -> None:
    """``--inputs`` against the model's declared inputs (names, rank, static dims, dtype),
    before any work: a mismatch raises :class:`~graph_autofusion.errors.SampleInputError`
    naming the file, the input and what the model declares."""
    if feeds is None:
        return
    import numpy as np

    from graph_autofusion.errors import SampleInputError
    from graph_autofusion.samples.run_failure import declared_dtype, missing_inputs

    inputs = [v for v in model.graph.inputs if v.const is None]

    def decl(v) -> str:
        dims = "?" if v.shape is None else ", ".join(str(d) for d in v.shape)
        return f"{v.name} {getattr(v.dtype, 'short', '?')}[{dims}]"

    expected = "; the model's inputs: " + ", ".join(decl(v) for v in inputs)
    names = {v.name for v in inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise SampleInputError(f"{path}: no model input named {unknown}{expected}")
    missing = missing_inputs(model, feeds)
    if missing:
        raise SampleInputError(f"{path}: no array for input(s) {missing}{expected}")
    for v in inputs:
        arr = np.asarray(feeds[v.name])
        shape = tuple(arr.shape)
        bad = v.shape is not None and (
            len(shape) != len(v.shape)
            or any(isinstance(d, int) and d != s for d, s in zip(v.shape, shape))
        )
        want = declared_dtype(v)  # None for strings and the like: nothing to compare with
        if not bad and want is not None:
            bad = want != arr.dtype
        if bad:
            raise SampleInputError(
                f"{path}: input {v.name!r} is {arr.dtype}{list(shape)}, the model declares "
                f"{decl(v)}{expected}"
            )


def cmd_fuse(args: argparse.Namespace) -> int:
    import os

    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.errors import ModelWriteError

    check_input_file(args.model, "model")
    src, out = os.path.abspath(args.model), os.path.abspath(args.output)
    if os.path.exists(out) and not os.path.isfile(out):
        what = "a directory" if os.path.isdir(out) else "not a regular file (a device, a pipe)"
        raise ModelWriteError(f"{args.output}: cannot write there: it is {what}")
    if src == out and not args.overwrite:
        raise ModelWriteError(
            f"{args.output}: the output is the input model; pass --overwrite to replace it"
        )
    folder = os.path.dirname(out)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ModelWriteError(f"{args.output}: cannot write there (folder missing or read-only)")
    if args.html:  # before the work, not after it (the report's folder is created)
        check_output_path(args.html, "HTML report", make_folder=True)
    if args.weights != "fp32" and args.target != "onnxruntime":
        from graph_autofusion.options import OptionsError

        raise OptionsError(
            f"--weights {args.weights} is an onnxruntime-target option (MatMulNBits); --target "
            f"{args.target}'s kernels take fp32 weights"
        )
    if args.custom_ops and args.target != "onnxruntime":
        from graph_autofusion.options import OptionsError

        raise OptionsError(
            f"--custom-ops is an onnxruntime-target option; --target {args.target} generates "
            f"its kernels anyway (drop --custom-ops, or use --target onnxruntime)"
        )
    from graph_autofusion.options import FuseOptions

    options = FuseOptions(  # the one record the whole fuse reads
        target=args.target,
        benefit_threshold=args.benefit_threshold,
        strategy=args.strategy,
        safe_mode=not args.unsafe,
        check_speed=not args.no_speed_check,
        custom_ops=args.custom_ops,
        size_switches=tuple(args.size_switch or ()),
        keep_fp32=(args.keep_fp32,) if args.keep_fp32 else (),
        weights=args.weights,
        weights_policy=args.weights_policy,
        weights_kernel=args.weights_kernel,
        weights_goal=args.weights_goal,
        denormals=args.denormals,
    )
    gaf = GraphAutoFusion(
        args.model,
        preset=args.preset,
        rule_files=args.rules or (),
        hardware=args.hardware,
        sample_inputs=load_feeds(args.inputs),
        options=options,
    )
    check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
    fuse_args = {"progress": progress_bar("fuse")}
    if args.stage:  # F17: progressive fusion
        prog = gaf.fuse_progressive(args.stage, **fuse_args)
        if not args.json:
            print(prog.to_text())
    else:
        gaf.fuse(**fuse_args)
    report = gaf.safe_fusion_report()
    data = report.to_dict() if args.json else None
    if args.stage and data is not None:
        data["progressive"] = gaf.progressive.to_dict()
    if args.float_check:
        check = gaf.float_check()
        if data is not None:
            data["float_check"] = check.to_dict()
    print(json.dumps(data, indent=2, default=str) if args.json else report.to_text())
    if args.float_check and not args.json:
        print(check.to_text())
    gaf.save(args.output, overwrite=args.overwrite)
    print(f"fused model written to {args.output}", file=sys.stderr)
    if gaf.kernel_dir:
        from graph_autofusion.codegen.ort_customop import load_line

        print(
            f"it uses generated custom operators: library and sources in {gaf.kernel_dir}\n"
            f"load it with:  {load_line(args.output)}\n"
            f"(plain onnxruntime: so = onnxruntime.SessionOptions(); "
            f"so.register_custom_ops_library({gaf.kernel_dir + '/libgaf_custom_ops.so'!r}))",
            file=sys.stderr,
        )
    if args.target == "cpu" and getattr(gaf.result, "kernels", None) is not None:  # torch engine
        kdir = os.path.splitext(out)[0] + ".kernels"
        data = gaf.compile_fused_operators(kdir)
        print(
            f"{len(data['groups'])} fused groups, {len(data['kernels'])} kernels written to {kdir}",
            file=sys.stderr,
        )
    if args.html:
        dest = gaf.write_html_report(args.html)
        print(f"HTML report written to {dest}", file=sys.stderr)
    return 0


def cmd_kernels(args: argparse.Namespace) -> int:
    """List (and with --profile, time) the generated kernels of a model on the cpu target."""
    from graph_autofusion.api import GraphAutoFusion

    check_input_file(args.model, "model")

    gaf = GraphAutoFusion(
        args.model,
        preset=args.preset,
        hardware=args.hardware,
        sample_inputs=load_feeds(args.inputs),
        target="cpu",
    )
    check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
    gaf.fuse(check_speed=False, progress=progress_bar("kernels"))
    r = gaf.result
    rows = []
    for i, low in enumerate(r.lowered):
        g = low.payload
        if not hasattr(g, "kernel"):  # an onnxruntime fused operator (onnxruntime engine)
            continue
        row = {
            "key": low.key,
            "kernel": g.kernel.name,
            "fused_ops": list(g.kernel.fused_ops),
            "signature": g.kernel.signature(),
        }
        if args.profile:
            row.update(gaf.profile_fusion_kernel(i, runs=args.runs))
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for row in rows:
        line = f"{row['kernel']}  {row['key']}  [{' '.join(row['fused_ops'])}]  {row['signature']}"
        if args.profile:
            line += (
                f"  {row['kernel_us']:.1f} us vs unfused {row['unfused_us']:.1f} us, "
                f"{row['achieved_gb_s']:.1f} GB/s ({100 * row['bandwidth_fraction']:.0f}% of "
                f"{row['bandwidth_gb_s']:.0f})"
            )
        print(line)
    n_kernels = len({row["kernel"] for row in rows})
    print(f"{len(rows)} fused groups, {n_kernels} distinct kernels")
    for b in r.rolled_back:
        print(f"rolled back {b.key}: {b.code}: {b.message}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from graph_autofusion.api import GraphAutoFusion

    check_input_file(args.original, "model")
    check_input_file(args.fused, "fused model")
    gaf = GraphAutoFusion(args.original, sample_inputs=load_feeds(args.inputs))
    check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
    res = gaf.verify_precision(args.fused, args.original)
    ok = res["cosine"] >= args.cosine
    if args.json:
        res["passed"], res["floor"] = ok, args.cosine
        print(json.dumps(res, indent=2, default=float))
        return 0 if ok else 1
    for name, v in res["outputs"].items():
        print(
            f"%{name}: cosine {v['cosine']:.9f}, max abs {v['max_abs']:.3g}, "
            f"max rel {v['max_rel']:.3g}"
        )
    worst = sorted(res["layers"].items(), key=lambda kv: kv[1]["cosine"])[:5]
    if worst:
        print("least similar intermediate values (same name in both models):")
        for name, v in worst:
            print(f"  %{name}: cosine {v['cosine']:.9f}, max abs {v['max_abs']:.3g}")
    print(
        f"{'PASS' if ok else 'FAIL'}: worst output cosine {res['cosine']:.9f} (floor {args.cosine})"
    )
    return 0 if ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from graph_autofusion.api import GraphAutoFusion

    check_input_file(args.model, "model")
    if args.fused:
        check_input_file(args.fused, "fused model")
    gaf = GraphAutoFusion(args.model, sample_inputs=load_feeds(args.inputs))
    check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
    res = gaf.verify_performance(
        args.fused or args.model, runs=args.runs, threads=args.threads, level=args.level
    )
    rows = ("baseline", "fused") if args.fused else ("baseline",)
    if not args.fused:  # the model against itself: no "fused" row, no "improvement" of noise
        res = {k: v for k, v in res.items() if k not in ("fused", "improvement")}
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"onnxruntime CPU, {args.threads} threads, level {args.level}, median of {args.runs}")
    for k in rows:
        v = res[k]
        print(
            f"  {k:<9} {v['latency_ms']:8.2f} ms  (min {v['min_ms']:.2f}, max "
            f"{v['max_ms']:.2f})  {v['throughput_per_s']:.1f}/s"
        )
    if args.fused:
        print(f"  improvement {100 * res['improvement']:+.1f}%")
    else:
        print("  (no fused model given: name one to compare, e.g. the output of fuse)")
    return 0

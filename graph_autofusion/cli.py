"""Command line: ``graph-autofusion COMMAND ...`` (also ``python -m graph_autofusion``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from graph_autofusion import __version__, defaults
from graph_autofusion.cli_args import (
    Parser,
    check_input_file,
    check_output_path,
    cosine_floor,
    fraction,
    positive_int,
    print_error,
)
from graph_autofusion.errors import GraphAutoFusionError


def _cmd_inspect(args: argparse.Namespace) -> int:
    from graph_autofusion.frontend.loader import load_model
    from graph_autofusion.report.inspect import inspect_model

    check_input_file(args.model, "model")
    model = load_model(args.model)
    report = inspect_model(model, name=str(args.model))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.to_text())
    return 0


def _cmd_match(args: argparse.Namespace) -> int:
    from graph_autofusion.api import GraphAutoFusion

    check_input_file(args.model, "model")
    gaf = GraphAutoFusion(
        args.model,
        preset=args.preset,
        rule_files=args.rules or (),
        max_cluster_nodes=args.max_cluster_nodes,
        max_cluster_inputs=args.max_cluster_inputs,
        clustering=not args.no_clusters,
    )
    report = gaf.candidates()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    return 0


def _cmd_rules_validate(args: argparse.Namespace) -> int:
    from graph_autofusion.patterns.library import builtin_rules
    from graph_autofusion.patterns.yaml_rules import load_rule_file

    builtin = {r.name for r in builtin_rules()}
    for path in args.files:
        check_input_file(path, "rule file")
        rules = load_rule_file(path)
        shadow = sorted(builtin & {r.name for r in rules})
        note = f"; same names as built-in rules: {shadow}" if shadow else ""
        print(f"{path}: {len(rules)} rule(s) OK: {', '.join(r.name for r in rules)}{note}")
    return 0


def _cmd_rules_list(args: argparse.Namespace) -> int:
    from graph_autofusion.patterns.library import builtin_rules

    rules = builtin_rules().preset(args.preset)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "fused_op": r.fuse_pattern,
                        "priority": r.priority,
                        "presets": list(r.presets),
                        "native": r.rewrite is not None,
                        "doc": r.doc,
                    }
                    for r in rules
                ],
                indent=2,
            )
        )
        return 0
    for r in sorted(rules, key=lambda r: -r.priority):
        native = "native" if r.rewrite is not None else "generic"
        print(
            f"{r.priority:>4}  {r.name:<26} -> {r.fuse_pattern:<30} {native:<8} "
            f"[{', '.join(r.presets)}]"
        )
    print(f"{len(rules)} rules")
    return 0


def _progress_bar(total_hint: str):
    """A ``progress(stage, i, n)`` callback on the progress display (``None`` when quiet)."""
    from graph_autofusion.report import progress

    return progress.callback(total_hint)


def _load_feeds(path: str | None):
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


def _check_feeds(model, feeds, path: str | None) -> None:
    """``--inputs`` against the model's declared inputs (names, rank, static dims, dtype),
    before any work: a mismatch raises :class:`~graph_autofusion.errors.SampleInputError`
    naming the file, the input and what the model declares."""
    if feeds is None:
        return
    import numpy as np

    from graph_autofusion.errors import SampleInputError

    inputs = [v for v in model.graph.inputs if v.const is None]

    def decl(v) -> str:
        dims = "?" if v.shape is None else ", ".join(str(d) for d in v.shape)
        return f"{v.name} {getattr(v.dtype, 'short', '?')}[{dims}]"

    expected = "; the model's inputs: " + ", ".join(decl(v) for v in inputs)
    names = {v.name for v in inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise SampleInputError(f"{path}: no model input named {unknown}{expected}")
    missing = [v.name for v in inputs if v.name not in feeds]
    if missing:
        raise SampleInputError(f"{path}: no array for input(s) {missing}{expected}")
    for v in inputs:
        arr = np.asarray(feeds[v.name])
        shape = tuple(arr.shape)
        bad = v.shape is not None and (
            len(shape) != len(v.shape)
            or any(isinstance(d, int) and d != s for d, s in zip(v.shape, shape))
        )
        try:
            want = v.dtype.to_numpy() if v.dtype is not None else None
        except TypeError:  # strings and the like: no NumPy dtype to compare with
            want = None
        if not bad and want is not None:
            bad = np.dtype(want) != arr.dtype
        if bad:
            raise SampleInputError(
                f"{path}: input {v.name!r} is {arr.dtype}{list(shape)}, the model declares "
                f"{decl(v)}{expected}"
            )


def _cmd_fuse(args: argparse.Namespace) -> int:
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
    )
    gaf = GraphAutoFusion(
        args.model,
        preset=args.preset,
        rule_files=args.rules or (),
        hardware=args.hardware,
        sample_inputs=_load_feeds(args.inputs),
        options=options,
    )
    _check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
    fuse_args = {"progress": _progress_bar("fuse")}
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


def _cmd_kernels(args: argparse.Namespace) -> int:
    """List (and with --profile, time) the generated kernels of a model on the cpu target."""
    from graph_autofusion.api import GraphAutoFusion

    check_input_file(args.model, "model")

    gaf = GraphAutoFusion(
        args.model,
        preset=args.preset,
        hardware=args.hardware,
        sample_inputs=_load_feeds(args.inputs),
        target="cpu",
    )
    _check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
    gaf.fuse(check_speed=False, progress=_progress_bar("kernels"))
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


def _cmd_verify(args: argparse.Namespace) -> int:
    from graph_autofusion.api import GraphAutoFusion

    check_input_file(args.original, "model")
    check_input_file(args.fused, "fused model")
    gaf = GraphAutoFusion(args.original, sample_inputs=_load_feeds(args.inputs))
    _check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
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


def _cmd_bench(args: argparse.Namespace) -> int:
    from graph_autofusion.api import GraphAutoFusion

    check_input_file(args.model, "model")
    if args.fused:
        check_input_file(args.fused, "fused model")
    gaf = GraphAutoFusion(args.model, sample_inputs=_load_feeds(args.inputs))
    _check_feeds(gaf.model, gaf.sample_inputs, args.inputs)
    res = gaf.verify_performance(
        args.fused or args.model, runs=args.runs, threads=args.threads, level=args.level
    )
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"onnxruntime CPU, {args.threads} threads, level {args.level}, median of {args.runs}")
    for k in ("baseline", "fused"):
        v = res[k]
        print(
            f"  {k:<9} {v['latency_ms']:8.2f} ms  (min {v['min_ms']:.2f}, max "
            f"{v['max_ms']:.2f})  {v['throughput_per_s']:.1f}/s"
        )
    print(f"  improvement {100 * res['improvement']:+.1f}%")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from graph_autofusion.demo import run_demo

    if args.html:
        check_output_path(args.html, "HTML report", make_folder=True)
    return run_demo(
        seq_len=args.seq_len,
        html=args.html or None,
        runs=args.runs,
        new_tokens=args.new_tokens,
        llama=not args.no_llama,
        torch_path=not args.no_llama,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="graph-autofusion",
        description="Automatic operator fusion for ONNX and PyTorch models.",
    )
    parser.add_argument("--version", action="version", version=f"graph-autofusion {__version__}")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress display (also off when stderr is not a terminal)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="operator and fusion-kind histograms, parameters, I/O")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("match", help="fusion candidates: rule matches, clusters, operator pairs")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--preset", default="all", help="transformer, llm, cnn, rnn or all")
    p.add_argument("--rules", action="append", metavar="FILE", help="extra YAML rule file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-clusters", action="store_true", help="skip automatic clustering")
    p.add_argument("--max-cluster-nodes", type=positive_int, default=defaults.MAX_CLUSTER_NODES)
    p.add_argument("--max-cluster-inputs", type=positive_int, default=defaults.MAX_CLUSTER_INPUTS)
    p.set_defaults(func=_cmd_match)

    p = sub.add_parser("rules", help="the rule library and rule files")
    rsub = p.add_subparsers(dest="rules_command", required=True)
    r = rsub.add_parser("validate", help="check YAML rule files (file, line and problem)")
    r.add_argument("files", nargs="+")
    r.set_defaults(func=_cmd_rules_validate)
    r = rsub.add_parser("list", help="the built-in rules")
    r.add_argument("--preset", default="all")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_cmd_rules_list)

    from graph_autofusion.cost.hardware_cli import add_hardware_commands
    from graph_autofusion.options import WEIGHT_FORMS, WEIGHT_POLICIES
    from graph_autofusion.planner.plan import STRATEGIES
    from graph_autofusion.report.analysis_cli import add_analyze_command

    add_hardware_commands(sub)
    add_analyze_command(sub)

    p = sub.add_parser("fuse", help="fuse for onnxruntime, verify every fusion (safe mode)")
    p.add_argument("model", help="path to an .onnx file (never modified)")
    p.add_argument("-o", "--output", required=True, help="where to write the fused model")
    p.add_argument("--overwrite", action="store_true", help="allow -o to be the input file")
    p.add_argument("--preset", default="all", help="transformer, llm, cnn, rnn or all")
    p.add_argument("--rules", action="append", metavar="FILE", help="extra YAML rule file")
    p.add_argument("--hardware", default="host", help="profile name or YAML path")
    p.add_argument("--strategy", default="auto", choices=STRATEGIES)
    p.add_argument("--benefit-threshold", type=fraction, default=defaults.BENEFIT_THRESHOLD)
    p.add_argument("--inputs", metavar="NPZ", help="sample inputs (.npz keyed by input name)")
    p.add_argument("--unsafe", action="store_true", help="skip safe mode (not recommended)")
    p.add_argument("--no-speed-check", action="store_true", help="keep fusions even if slower")
    p.add_argument(
        "--target",
        default="onnxruntime",
        choices=["onnxruntime", "cpu"],
        help="onnxruntime's fused operators, or generated C kernels (cpu; writes OUTPUT.kernels/)",
    )
    p.add_argument(
        "--custom-ops",
        action="store_true",
        help="onnxruntime target: groups with no onnxruntime operator become generated custom "
        "operators (writes OUTPUT.kernels/, which the fused model then needs)",
    )
    p.add_argument(
        "--stage",
        action="append",
        metavar="RULES",
        help="progressive fusion: a stage of comma-separated rule names (repeat for the next "
        "stage); stops at the first stage that fails validation, keeping the ones before",
    )
    p.add_argument(
        "--size-switch",
        action="append",
        metavar="RULE:INPUT[AXIS]>=N",
        help="the rule applies only when the input's size meets the condition (repeatable)",
    )
    p.add_argument(
        "--keep-fp32",
        metavar="OPS",
        help="in float16/bfloat16 models these operators compute in float32 (comma-separated; "
        "'default': BatchNormalization and the reductions)",
    )
    p.add_argument(
        "--weights",
        default="fp32",
        choices=list(WEIGHT_FORMS),
        help="how contractions by a constant matrix store their weights: fp32 (default), int8 "
        "or int4 (blockwise MatMulNBits, each layer verified by safe mode; failures stay fp32), "
        "fp16 (no fused form on onnxruntime CPU: reported kept fp32)",
    )
    p.add_argument(
        "--weights-policy",
        default="default",
        choices=list(WEIGHT_POLICIES),
        help="with --weights int8/int4: 'default' keeps the LM head and the embedding tables "
        "fp32; 'all' compresses them too (head int8, tables int8), each verified",
    )
    p.add_argument(
        "--float-check",
        action="store_true",
        help="debug: each fused group's drift from the original computing in float32",
    )
    p.add_argument(
        "--html",
        metavar="PATH",
        help="also write the self-contained HTML report (graph before and after, candidates, "
        "precision per fusion and per layer, estimated vs measured time)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_fuse)

    p = sub.add_parser("kernels", help="the generated kernels of a model (cpu target)")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--preset", default="all")
    p.add_argument("--hardware", default="host")
    p.add_argument("--inputs", metavar="NPZ")
    p.add_argument("--profile", action="store_true", help="time each kernel vs its operators")
    p.add_argument("--runs", type=positive_int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_kernels)

    p = sub.add_parser("verify", help="compare a fused model with the original")
    p.add_argument("original")
    p.add_argument("fused")
    p.add_argument("--inputs", metavar="NPZ")
    p.add_argument(
        "--cosine",
        type=cosine_floor,
        default=defaults.E2E_COSINE,
        help=f"pass floor (default {defaults.E2E_COSINE})",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("bench", help="latency and throughput in onnxruntime, side by side")
    p.add_argument("model")
    p.add_argument("fused", nargs="?")
    p.add_argument("--inputs", metavar="NPZ")
    p.add_argument("--runs", type=positive_int, default=20)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--level", default="all", choices=["disable", "basic", "extended", "all"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "demo", help="the main job on the built-in models (MiniLM, a Llama-style decoder)"
    )
    p.add_argument("--seq-len", type=positive_int, default=16)
    p.add_argument("--html", default="demo-report.html", help="the HTML report ('' for none)")
    p.add_argument("--runs", type=positive_int, default=20, help="timed runs per benchmark")
    p.add_argument("--new-tokens", type=positive_int, default=20, help="tokens per Llama generate")
    p.add_argument("--no-llama", action="store_true", help="ONNX MiniLM only (no PyTorch models)")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script. Returns the exit status."""
    from graph_autofusion.report import progress

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed on one line
        return e.code if isinstance(e.code, int) else 2
    try:
        with progress.reporting(False if args.quiet else None):
            return int(args.func(args) or 0)
    except (GraphAutoFusionError, OSError) as e:  # user mistakes and unwritable destinations
        return print_error(e)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

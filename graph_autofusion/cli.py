"""Command line: ``graph-autofusion COMMAND ...`` (also ``python -m graph_autofusion``)."""

from __future__ import annotations

import argparse
import json
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
from graph_autofusion.cli_fuse import (
    cmd_bench,
    cmd_fuse,
    cmd_kernels,
    cmd_verify,
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

    from graph_autofusion.cli_analyze import add_analyze_command
    from graph_autofusion.cost.hardware_cli import add_hardware_commands
    from graph_autofusion.options import (
        DENORMAL_MODES,
        WEIGHT_FORMS,
        WEIGHT_GOALS,
        WEIGHT_KERNELS,
        WEIGHT_POLICIES,
    )
    from graph_autofusion.planner.plan import STRATEGIES

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
        "or int4 (blockwise MatMulNBits), fp16 (our GemvF16 operator, its library saved beside "
        "the model); each layer verified by safe mode, failures stay fp32",
    )
    p.add_argument(
        "--weights-policy",
        default="default",
        choices=list(WEIGHT_POLICIES),
        help="'default' keeps the LM head and the embedding tables at a higher precision "
        "(fp16 in an int8/int4 model, fp32 in an fp16 one); 'all' compresses them too (head "
        "and tables int8, or fp16 in an fp16 model), each verified",
    )
    p.add_argument(
        "--weights-kernel",
        default="auto",
        choices=list(WEIGHT_KERNELS),
        help="what runs an int8/int4 contraction: 'auto' (default: safe mode times "
        "onnxruntime's MatMulNBits against our GemvQ per layer shape and keeps the faster; "
        "MatMulNBits when speed checks are off), or that kernel, untimed (a layer GemvQ "
        "cannot take stays MatMulNBits)",
    )
    p.add_argument(
        "--weights-goal",
        default="speed",
        choices=list(WEIGHT_GOALS),
        help="'speed' (default): a layer timed slower compressed than fp32 on the sample "
        "inputs stays fp32 (a prefill's usually is); 'size': every layer that passes its "
        "accuracy checks is compressed, whatever its time",
    )
    p.add_argument(
        "--denormals",
        default="flush",
        choices=list(DENORMAL_MODES),
        help="'flush' (default): the sessions graph-autofusion opens for the fused model "
        "(--bench, a run) flush denormal floats to zero, which models with large attention "
        "logits make by the million at ~100 cycles each; 'keep': IEEE denormals",
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
    p.set_defaults(func=cmd_fuse)

    p = sub.add_parser("kernels", help="the generated kernels of a model (cpu target)")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--preset", default="all")
    p.add_argument("--hardware", default="host")
    p.add_argument("--inputs", metavar="NPZ")
    p.add_argument("--profile", action="store_true", help="time each kernel vs its operators")
    p.add_argument("--runs", type=positive_int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_kernels)

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
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("bench", help="latency and throughput in onnxruntime, side by side")
    p.add_argument("model")
    p.add_argument("fused", nargs="?")
    p.add_argument("--inputs", metavar="NPZ")
    p.add_argument("--runs", type=positive_int, default=20)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--level", default="all", choices=["disable", "basic", "extended", "all"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

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

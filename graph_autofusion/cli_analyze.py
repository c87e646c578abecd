"""``graph-autofusion analyze MODEL [--hardware NAME|PATH] [--preset P] [--rules FILE]...
[--strategy auto|greedy|dp|evolutionary] [--benefit-threshold X] [--dim SYM=N]... [--json]
[--html PATH]``.

:func:`add_analyze_command` registers the command on the CLI's subparsers (it sets ``func``,
returning the exit status, like the other commands of ``cli.py``). :func:`main` runs it on its
own parser (tests, ``python -m graph_autofusion.cli_analyze``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from graph_autofusion import defaults
from graph_autofusion.cli_args import (
    Parser,
    check_input_file,
    check_output_path,
    fraction,
    positive_int,
    print_error,
)
from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.yaml_rules import load_rule_file
from graph_autofusion.pipeline import add_other_targets, plan_for_target
from graph_autofusion.planner.analysis import analyze_model, default_feeds
from graph_autofusion.planner.plan import STRATEGIES
from graph_autofusion.report.analysis_report import write_atomic

__all__ = ["add_analyze_command", "build_parser", "main", "run_analyze"]


def _dim(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected SYMBOL=INT, got {text!r}")
    return name.strip(), int(value)


def run_analyze(args: argparse.Namespace) -> int:
    """The ``analyze`` command: load, analyze, print text or JSON, optionally write HTML."""
    from graph_autofusion.frontend.loader import load_model

    check_input_file(args.model, "model")
    if args.html:  # before the work, not after it
        check_output_path(args.html, "HTML report", make_folder=True)
    profile = load_profile(args.hardware)  # unknown name: HardwareError listing the known ones
    rules = builtin_rules().preset(args.preset)
    for path in args.rules or ():
        rules = rules + load_rule_file(path)
    model = load_model(args.model)
    if args.target:
        opts = FuseOptions(
            target=args.target,
            benefit_threshold=args.benefit_threshold,
            strategy=args.strategy,
            max_cluster_nodes=args.max_cluster_nodes,
            max_cluster_inputs=args.max_cluster_inputs,
            clustering=not args.no_clusters,
        )
        feeds = default_feeds(model, symbols=dict(args.dim or ()))
        report = plan_for_target(model, rules, profile, opts, feeds, model_name=str(args.model))[1]
        if args.compare_targets:
            add_other_targets(report, model, rules, profile, opts, feeds)
    else:
        report = analyze_model(
            model,
            rules,
            profile,
            symbols=dict(args.dim or ()),
            benefit_threshold=args.benefit_threshold,
            strategy=args.strategy,
            max_cluster_nodes=args.max_cluster_nodes,
            max_cluster_inputs=args.max_cluster_inputs,
            clustering=not args.no_clusters,
            model_name=str(args.model),
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.to_text(reasons=not args.brief))
    if args.html:
        dest = write_atomic(args.html, report.to_html())
        print(f"HTML report written to {dest}", file=sys.stderr)
    return 0


def add_analyze_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``analyze`` on ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "analyze",
        help="benefit analysis: every candidate's costs, verdict and the fusion plan",
        description="Cost every fusion candidate (rule matches and automatic clusters) on a "
        "hardware profile and choose a non-overlapping plan. Symbolic dims default to 1 "
        "(position 0) and 16 (elsewhere); set them with --dim.",
    )
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--hardware", default="host", help="profile name or YAML path (default: host)")
    p.add_argument("--preset", default="all", help="transformer, llm, cnn, rnn or all")
    p.add_argument("--rules", action="append", metavar="FILE", help="extra YAML rule file")
    p.add_argument("--strategy", default="auto", choices=STRATEGIES)
    p.add_argument(
        "--benefit-threshold",
        type=fraction,
        default=defaults.BENEFIT_THRESHOLD,
        help="minimum relative saving to fuse (default 0.2; a rule may set its own)",
    )
    p.add_argument(
        "--dim", action="append", type=_dim, metavar="SYM=N", help="value of a symbolic dim"
    )
    p.add_argument("--no-clusters", action="store_true", help="rule matches only")
    p.add_argument(
        "--target",
        choices=["onnxruntime", "cpu"],
        help="plan exactly what `fuse --target T` carries out (default: every candidate on the "
        "hardware profile, whatever executes it)",
    )
    p.add_argument(
        "--compare-targets",
        action="store_true",
        help="with --target: also list what the other target would fuse",
    )
    p.add_argument("--max-cluster-nodes", type=positive_int, default=defaults.MAX_CLUSTER_NODES)
    p.add_argument("--max-cluster-inputs", type=positive_int, default=defaults.MAX_CLUSTER_INPUTS)
    p.add_argument("--brief", action="store_true", help="no reason sentence under each row")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
    p.set_defaults(func=run_analyze)
    return p


def build_parser() -> argparse.ArgumentParser:
    """A parser with only the ``analyze`` command (the main CLI adds it to its own)."""
    parser = Parser(prog="graph-autofusion")
    sub = parser.add_subparsers(dest="command", required=True)
    add_analyze_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``analyze`` like the main CLI: errors print one line and return 2."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed on one line
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args.func(args) or 0)
    except (GraphAutoFusionError, OSError) as e:
        return print_error(e)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

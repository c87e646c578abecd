"""Command line: ``graph-autofusion COMMAND ...`` (also ``python -m graph_autofusion``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from graph_autofusion import __version__
from graph_autofusion.errors import GraphAutoFusionError


def _cmd_inspect(args: argparse.Namespace) -> int:
    from graph_autofusion.frontend.loader import load_model
    from graph_autofusion.report.inspect import inspect_model

    model = load_model(args.model)
    report = inspect_model(model, name=str(args.model))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.to_text())
    return 0


def _cmd_match(args: argparse.Namespace) -> int:
    from graph_autofusion.api import GraphAutoFusion

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

    return run_demo(seq_len=args.seq_len)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graph-autofusion",
        description="Automatic operator fusion for ONNX and PyTorch models.",
    )
    parser.add_argument("--version", action="version", version=f"graph-autofusion {__version__}")
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
    p.add_argument("--max-cluster-nodes", type=int, default=64)
    p.add_argument("--max-cluster-inputs", type=int, default=8)
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

    add_hardware_commands(sub)

    p = sub.add_parser("demo", help="run the main job on the built-in demo model (MiniLM)")
    p.add_argument("--seq-len", type=int, default=16)
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script. Returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GraphAutoFusionError as e:
        print(f"graph-autofusion: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"graph-autofusion: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

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

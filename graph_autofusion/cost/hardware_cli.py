"""``graph-autofusion hardware list | show NAME [--json] | calibrate [-o PATH] [--quick]``.

:func:`add_hardware_commands` registers the ``hardware`` command on the CLI's subparsers; each
sub-command sets ``func`` (returning the exit status), like the other commands in ``cli.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from graph_autofusion.cli_args import check_output_path
from graph_autofusion.cost import calibrate
from graph_autofusion.cost.hardware import (
    HOST,
    HardwareError,
    host_profile_path,
    list_profiles,
    load_profile,
    save_profile,
)

__all__ = ["add_hardware_commands", "drift_warnings"]


def _cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for name in list_profiles():
        if name == HOST:
            path = host_profile_path()
            if not path.is_file():
                rows.append({"name": HOST, "kind": "cpu", "calibrated": False, "path": str(path)})
                continue
        try:
            p = load_profile(name)
        except HardwareError as e:  # a broken user file must not hide the others
            rows.append({"name": name, "error": str(e)})
            continue
        rows.append(
            {
                "name": name,
                "kind": p.kind,
                "memory_bandwidth_gbs": p.memory_bandwidth_gbs,
                "peak_gflops_f32": p.peak_gflops["f32"],
                "peak_gflops_f16": p.peak_gflops.get("f16", p.peak_gflops["f32"]),
                "launch_overhead_us": p.launch_overhead_us,
                "local_memory_kb": p.local_memory_kb,
                "description": p.description,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'name':<12} {'kind':<4} {'GB/s':>8} {'f32 GF/s':>10} {'f16 GF/s':>10} "
        f"{'launch us':>9} {'local KiB':>9}  description"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<12} error: {r['error']}")
        elif "description" not in r:
            print(
                f"{HOST:<12} cpu  not calibrated yet: run `graph-autofusion hardware "
                f"calibrate` (writes {r['path']})"
            )
        else:
            print(
                f"{r['name']:<12} {r['kind']:<4} {r['memory_bandwidth_gbs']:>8,.1f} "
                f"{r['peak_gflops_f32']:>10,.0f} {r['peak_gflops_f16']:>10,.0f} "
                f"{r['launch_overhead_us']:>9g} {r['local_memory_kb']:>9g}  {r['description']}"
            )
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    p = load_profile(args.name)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2))
    else:
        print("\n".join(p.summary_lines()))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:

    out = Path(args.output) if args.output else host_profile_path()
    if args.output:  # before the measurements, not after them
        check_output_path(args.output, "hardware profile", make_folder=True)
    mode = "quick" if args.quick else "full"
    print(f"calibrating this machine ({mode} mode) ...", flush=True)
    p = calibrate.calibrate_host(quick=args.quick)  # looked up per call (tests replace it)
    previous = _previous(out)
    save_profile(p, out)
    print("\n".join(p.summary_lines()))
    print(f"wrote {out}")
    for line in drift_warnings(previous, p):
        print(f"warning: {line}", file=sys.stderr)
    return 0


#: a calibrated number this many times off the file it replaces is worth a second look
DRIFT_FACTOR = 1.4


def _previous(path: Path):
    try:
        return load_profile(path) if path.is_file() else None
    except (HardwareError, OSError):
        return None


def drift_warnings(previous, new) -> list[str]:
    """Sentences for the calibrated numbers that moved by more than :data:`DRIFT_FACTOR` since
    the profile ``new`` replaces (empty when there was none). A shared machine has transient
    states: this project's 2-core host streams ~47 GB/s most of the time and ~80 GB/s in windows
    of 12-60 s, and a calibration inside one writes the outlier into every later plan."""
    if previous is None or previous.name != new.name:
        return []
    pairs = [
        ("memory bandwidth", "GB/s", previous.memory_bandwidth_gbs, new.memory_bandwidth_gbs),
        ("fp32 peak", "GFLOP/s", previous.peak_gflops["f32"], new.peak_gflops["f32"]),
        ("launch overhead", "us", previous.launch_overhead_us, new.launch_overhead_us),
    ]
    extra = previous.extra or {}
    when = extra.get("calibrated_at", "the previous calibration")
    if extra.get("calibration"):
        when = f"{extra['calibration']} calibration, {when}"
    out = []
    for what, unit, old, now in pairs:
        if old and now and max(old / now, now / old) > DRIFT_FACTOR:
            out.append(
                f"{what} {now:g} {unit} is {now / old:.2f}x the {old:g} {unit} of the profile it "
                f"replaces ({when}); one of the two calibrations may have caught a transient "
                f"state of the machine: calibrate again and compare before planning with it"
            )
    return out


def add_hardware_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hardware list|show|calibrate`` on ``subparsers``; returns the new parser."""
    p = subparsers.add_parser("hardware", help="hardware profiles: list, show, calibrate")
    hsub = p.add_subparsers(dest="hardware_command", required=True)
    h = hsub.add_parser("list", help="shipped, calibrated and user profiles with key numbers")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.set_defaults(func=_cmd_list)
    h = hsub.add_parser("show", help="every field of one profile, with sources")
    h.add_argument("name", help="profile name (see `hardware list`) or path of a YAML file")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.set_defaults(func=_cmd_show)
    h = hsub.add_parser("calibrate", help="measure this machine and write its host profile")
    h.add_argument(
        "-o", "--output", metavar="PATH", help=f"where to write (default {host_profile_path()})"
    )
    h.add_argument("--quick", action="store_true", help="a few seconds instead of ~30")
    h.set_defaults(func=_cmd_calibrate)
    return p

"""No-behaviour-change digests: fuse every zoo model and record SHA-256 digests of what came out.

Run from the repository root::

    .venv/bin/python tools/digest.py --out benchmarks/results/digest_<commit>.json
    .venv/bin/python tools/digest.py --models llama,bert --out /tmp/d.json   # a subset
    .venv/bin/python tools/digest.py --compare A.json B.json                 # what differs

For every zoo model (``graph_autofusion.testing.ALL_NAMES``: the models and the
``resnet50_bn`` variant), both exporters (``EXPORTERS``) and both targets (``onnxruntime``,
``cpu``): ``GraphAutoFusion(path, preset="all", hardware=PROFILE, sample_inputs=the zoo's
example feeds, target=T).fuse(check_speed=False)`` with a shipped hardware profile
(``x86_avx2`` unless ``--hardware``; ``host`` is calibrated per machine and would vary), safe
mode on (numerics, fp16 range and Monte-Carlo checks stay on; only the timing check is off).
Recorded per run, as SHA-256 digests:

- ``onnx``: the fused model (``to_onnx``), serialized with ``deterministic=True``;
- ``kernels``: the generated kernel sources (cpu target: every generated group's kernel in one
  translation unit, as ``codegen.c_backend.library_source``; onnxruntime target: the
  custom-operator library's C source when the fused model uses one, else empty);
- ``manifest`` (cpu target): ``codegen.manifest.manifest`` without the compiler version;
- ``report``: ``SafeFusionReport.to_dict()`` with every timing and host-dependent key dropped
  (:data:`DROP_KEYS`, and any key ending in ``_s``/``_ms``/``_us``/``seconds``), serialized
  as sorted-key JSON; floats are kept as Python writes them (the numerics are deterministic
  on one machine: onnxruntime runs with a fixed thread count and seeded inputs).

Determinism: two runs of one commit on one machine give equal digests (checked on a9d04da,
``benchmarks/results/digest_a9d04da.json``): the fused models, kernels and safe mode's
numerics do not depend on timing, thread counts or the machine's load. The script measures
the ``graph_autofusion`` beside it (the file records which), never an installed copy: an
earlier version imported the installed package and so measured whatever that checkout held.

Each row also keeps a few plain facts (fused count, rolled back codes) to make a difference
readable. The digests describe one machine: compare runs made on the same machine (the
kernels' compile options and onnxruntime's numerics depend on the CPU). A run that raises is
recorded with its error text (a digest of it), not dropped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the repository this script belongs to: its graph_autofusion is the one measured (not an
#: installed copy, which ``python tools/digest.py`` would otherwise import)
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = ("onnxruntime", "cpu")

#: report keys that hold a time, a date or a host-dependent value: dropped before digesting
DROP_KEYS = frozenset(
    {
        "timings_s",
        "timings",
        "time_unfused_us",
        "time_fused_us",
        "measured_improvement",
        "compile_s",
        "from_cache",
        "created",
        "date",
        "host",
        "compiler",
        "path",
        "source_path",
    }
)
_TIME_SUFFIX = re.compile(r"(^|_)(s|ms|us|ns|seconds|time|date)$")
#: a path into a temporary or cache folder, inside a message or note (host-dependent)
_PATH = re.compile(r"(/tmp/|/var/folders/|\.cache/)\S*")


def sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def scrub(value: Any) -> Any:
    """``value`` with timing and host-dependent keys dropped, recursively; NaN and infinities
    as strings (JSON has none)."""
    if isinstance(value, dict):
        return {
            str(k): scrub(v)
            for k, v in value.items()
            if str(k) not in DROP_KEYS and not _TIME_SUFFIX.search(str(k))
        }
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return _PATH.sub("<path>", value)
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(scrub(value), sort_keys=True, default=repr)


def kernel_source(result: Any) -> str:
    """The generated kernel sources of one fuse result ("" when it generated none)."""
    from graph_autofusion.codegen.c_backend import library_source

    kernels = getattr(result, "kernels", None)
    if kernels:
        unique = {g.kernel.name: g.kernel for g in kernels}
        return library_source(list(unique.values()))
    lib = getattr(result, "custom_ops", None)
    if lib is not None:
        return Path(lib.source_path).read_text()
    return ""


def digest_one(
    name: str, exporter: str, target: str, hardware: str, dump: str | None = None
) -> dict[str, Any]:
    from graph_autofusion import GraphAutoFusion
    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.report.fuse_report import SafeFusionReport
    from graph_autofusion.testing import example_feeds, export_onnx

    path = export_onnx(name, exporter)
    gaf = GraphAutoFusion(
        path, preset="all", hardware=hardware, sample_inputs=example_feeds(name), target=target
    )
    gaf.fuse(check_speed=False, progress=lambda *a, **k: None)
    res = gaf.result
    report = canonical_json(SafeFusionReport(res, name).to_dict())
    if dump:  # what was digested, to diff two runs
        Path(dump).mkdir(parents=True, exist_ok=True)
        stem = Path(dump) / f"{name}-{exporter}-{target}"
        stem.with_suffix(".report.json").write_text(json.dumps(json.loads(report), indent=1))
        stem.with_suffix(".c").write_text(kernel_source(res))
    row: dict[str, Any] = {
        "model": name,
        "exporter": exporter,
        "target": target,
        "fused": len(res.lowered),
        "rolled_back": sorted(f"{b.key}:{b.code}" for b in res.rolled_back),
        "onnx": sha(to_onnx(res.model).SerializeToString(deterministic=True)),
        "kernels": sha(kernel_source(res)),
        "report": sha(report),
    }
    if getattr(res, "kernels", None) is not None:
        from graph_autofusion.codegen.manifest import manifest

        row["manifest"] = sha(canonical_json(manifest(res)))
    return row


def run(
    models: list[str], hardware: str, *, verbose: bool = True, dump: str | None = None
) -> list[dict[str, Any]]:
    import onnxruntime as ort  # heavy: only when fusing

    from graph_autofusion.testing import EXPORTERS

    ort.set_default_logger_severity(3)
    rows = []
    for name in models:
        for exporter in EXPORTERS:
            for target in TARGETS:
                t = time.perf_counter()
                try:
                    row = digest_one(name, exporter, target, hardware, dump)
                except Exception as exc:  # recorded, not dropped: a crash is a difference too
                    text = f"{type(exc).__name__}: {exc}"
                    row = {"model": name, "exporter": exporter, "target": target}
                    row["error"] = sha(_PATH.sub("<path>", text))
                    row["error_text"] = _PATH.sub("<path>", text)[:500]
                rows.append(row)
                if verbose:
                    print(
                        f"{name:<12} {exporter:<12} {target:<12} "
                        f"{row.get('fused', '-'):>4} {time.perf_counter() - t:6.1f}s "
                        f"{row.get('onnx', row.get('error_text', ''))[:16]}",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["model"], row["exporter"], row["target"]


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Lines naming every difference between two digest files (empty: equal)."""
    out = []
    ra, rb = {_key(r): r for r in a["rows"]}, {_key(r): r for r in b["rows"]}
    for k in sorted(ra.keys() - rb.keys()):
        out.append(f"{'/'.join(k)}: only in the first")
    for k in sorted(rb.keys() - ra.keys()):
        out.append(f"{'/'.join(k)}: only in the second")
    for k in sorted(ra.keys() & rb.keys()):
        x, y = ra[k], rb[k]
        for field in sorted(x.keys() | y.keys()):
            if x.get(field) != y.get(field):
                out.append(f"{'/'.join(k)}: {field}: {x.get(field)!r} != {y.get(field)!r}")
    if a.get("hardware") != b.get("hardware"):
        out.append(f"hardware profile: {a.get('hardware')} != {b.get('hardware')}")
    return out


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, **_quiet())
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "graph_autofusion"], cwd=ROOT, **_quiet()
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _quiet() -> dict[str, Any]:
    return {"capture_output": True, "text": True, "check": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the digests to this JSON file")
    ap.add_argument("--models", help="comma-separated subset of the zoo (default: every model)")
    ap.add_argument("--hardware", default="x86_avx2", help="a shipped hardware profile")
    ap.add_argument("--dump", help="also write the digested reports and sources to this folder")
    ap.add_argument("--commit", help="the commit to record (default: git's HEAD here)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="print the differences")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        diffs = compare(a, b)
        for line in diffs:
            print(line)
        ran = {len(a["rows"]), len(b["rows"])}
        print(f"{len(diffs)} difference(s) over {'/'.join(map(str, sorted(ran)))} runs")
        return 1 if diffs else 0
    if not args.out:
        ap.error("--out is required unless --compare")
    from graph_autofusion.testing import ALL_NAMES

    models = args.models.split(",") if args.models else list(ALL_NAMES)
    unknown = sorted(set(models) - set(ALL_NAMES))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; the zoo has {list(ALL_NAMES)}")
    rows = run(models, args.hardware, dump=args.dump)
    import graph_autofusion

    data = {
        "commit": args.commit or _commit(),
        "package": str(Path(graph_autofusion.__file__).parent),
        "hardware": args.hardware,
        "models": models,
        "all_models": sorted(models) == sorted(ALL_NAMES),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""IR scaling benchmark: import, verify and re-export synthetic 10,000- and 100,000-node graphs.

Run: ``.venv/bin/python benchmarks/ir_scale.py`` (writes ``benchmarks/results/ir_scale.json``
and prints a table). The graphs come from :mod:`graph_autofusion.testing.synthetic`; each is
serialized to ONNX bytes first, so "import" is ``load_onnx`` on a real ModelProto (with shape
inference), "verify" is the IR verifier plus a topological sort, and "export" is ``to_onnx``
plus serialization. Time per node should stay about flat from 10k to 100k nodes.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import onnx

from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx
from graph_autofusion.ir.verify import verify
from graph_autofusion.testing.synthetic import synthetic_transformer

SIZES = (10_000, 100_000)
OUT = Path(__file__).parent / "results" / "ir_scale.json"


def measure(num_nodes: int) -> dict:
    proto = to_onnx(synthetic_transformer(num_nodes))
    data = proto.SerializeToString()
    row = {"target_nodes": num_nodes, "nodes": len(proto.graph.node), "onnx_bytes": len(data)}
    t = time.perf_counter()
    model = load_onnx(onnx.load_from_string(data))
    row["import_s"] = time.perf_counter() - t
    t = time.perf_counter()
    verify(model)
    model.graph.topological_sort()
    row["verify_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out = to_onnx(model).SerializeToString()
    row["export_s"] = time.perf_counter() - t
    row["roundtrip_equal_nodes"] = len(onnx.load_from_string(out).graph.node) == row["nodes"]
    row["total_s"] = row["import_s"] + row["verify_s"] + row["export_s"]
    row["us_per_node"] = 1e6 * row["total_s"] / row["nodes"]
    return row


def main() -> int:
    rows = [measure(n) for n in SIZES]
    ratio = rows[-1]["total_s"] / rows[0]["total_s"]
    size_ratio = rows[-1]["nodes"] / rows[0]["nodes"]
    result = {
        "benchmark": "ir_scale",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "rows": rows,
        "time_ratio": ratio,
        "size_ratio": size_ratio,
        "scaling_exponent": __import__("math").log(ratio) / __import__("math").log(size_ratio),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'nodes':>8} {'import s':>9} {'verify s':>9} {'export s':>9} {'total s':>8} {'us/node':>8}"
    )
    for r in rows:
        print(
            f"{r['nodes']:>8} {r['import_s']:>9.2f} {r['verify_s']:>9.2f} {r['export_s']:>9.2f} "
            f"{r['total_s']:>8.2f} {r['us_per_node']:>8.1f}"
        )
    print(
        f"time ratio {ratio:.2f} for size ratio {size_ratio:.2f} "
        f"(scaling exponent {result['scaling_exponent']:.2f}; 1.0 = linear) -> {OUT}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

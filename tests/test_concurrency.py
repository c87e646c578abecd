"""Concurrency (issue 15): two processes fusing models and compiling kernels into the same
kernel cache at once both succeed and never read a half-written file.

The kernel cache (:mod:`graph_autofusion.codegen.compiler`, ``$GRAPH_AUTOFUSION_CACHE/kernels``)
writes ``kernels.c`` through a temporary file and ``os.replace`` and links each library under a
private name renamed into place, so a process sees an entry whole or not at all, and two that
compile the same key both build it and the second rename replaces the first with equal
content. The test makes them actually race: two interpreters are started once, and in each of
:data:`ROUNDS` rounds both wait at a file barrier, then point the cache at the same *cold*
folder and fuse the same model on the cpu target (its kernel library, the Gemv kernel and
the runtime shim compiled into that folder) and compile one more shared batch of kernels directly. Each
process then runs what it loaded against the original; after each round the cache holds one
complete entry per key, with a library the loader accepts and no temporary file left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROUNDS = 3
WORKERS = 2
TIMEOUT_S = 300

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    import numpy as np

    from graph_autofusion import GraphAutoFusion
    from graph_autofusion.codegen.compiler import compile_library
    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.runtime.kernels import load_library
    from graph_autofusion.testing import ort_outputs
    from graph_autofusion.samples.inputs import generate_inputs
    from tests.codegen.test_compiler import _kernels
    from tests.test_fuse_pipeline import TRANSFORMER_BLOCK

    root, me, rounds, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    original = parse_model(TRANSFORMER_BLOCK)
    feeds = generate_inputs(original)
    want = ort_outputs(to_onnx(original), feeds)
    batch = _kernels(6, 500)  # the same batch in every worker and round
    out = []
    for r in range(rounds):
        (root / f"ready-{r}-{me}").touch()
        deadline = time.monotonic() + 120
        while len(list(root.glob(f"ready-{r}-*"))) < workers:  # the barrier
            assert time.monotonic() < deadline, "the other worker never arrived"
            time.sleep(0.001)
        os.environ["GRAPH_AUTOFUSION_CACHE"] = str(root / f"cache{r}")  # cold, shared
        gaf = GraphAutoFusion(original, target="cpu", hardware="x86_avx2", sample_inputs=feeds)
        gaf.fuse(check_speed=False)
        res = gaf.result
        assert res.lowered and res.library is not None, res.notes
        got = gaf.run(feeds)
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-4)
        lib = compile_library(batch)
        load_library(lib)  # a half-written library would not load
        out.append({
            "fused": res.library.path,
            "fused_source": Path(res.library.source_path).read_text(),
            "fused_from_cache": res.library.from_cache,
            "batch": lib.path,
            "batch_from_cache": lib.from_cache,
        })
    print(json.dumps(out))
    """
)


def test_two_processes_share_a_cold_kernel_cache_at_once(tmp_path):
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), str(i), str(ROUNDS), str(WORKERS)],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    done = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    failures = [f"worker {i}: {err[-3000:]}" for i, (p, (_, err)) in enumerate(zip(procs, done))]
    assert all(p.returncode == 0 for p in procs), "\n".join(failures)
    results = [json.loads(out) for out, _ in done]

    for r in range(ROUNDS):
        a, b = (res[r] for res in results)
        # the same keys, so the same entries: both processes wrote into (or read) each one
        assert a["fused"] == b["fused"] and a["batch"] == b["batch"]
        assert a["fused_source"] == b["fused_source"]
        cache = tmp_path / f"cache{r}" / "kernels"
        assert str(cache) in a["fused"] and str(cache) in a["batch"]
        entries = sorted(p.name for p in cache.iterdir())
        # the model's library and the batch (and the Gemv kernel where used): one entry each
        assert {Path(a["fused"]).parent.name, Path(a["batch"]).parent.name} <= set(entries)
        for entry in entries:
            assert sorted(os.listdir(cache / entry)) == ["kernels.c", "kernels.so"]
        assert Path(a["fused"]).with_name("kernels.c").read_text() == a["fused_source"]
        leftovers = [p for p in (tmp_path / f"cache{r}").rglob(".*") if p.is_file()]
        assert not leftovers, leftovers

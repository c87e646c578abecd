"""The fuse pipeline: one package, a module per target and per stage family.

    from graph_autofusion.pipeline import fuse_model          # onnxruntime target
    from graph_autofusion.pipeline.cpu import fuse_model_cpu  # cpu target (generated kernels)

Stages, in order (``result.timings`` uses these names; ``dump_dir`` gets each artifact):

=============  ======================================================================
plan           working copy, folded ``Reshape`` shapes, candidates, cost, plan
               (:func:`.plan.plan_for_target`, shared by every target; ``plan.json``)
lower          the target's lowering of the chosen groups (native operators;
               kernel IR on the cpu target, ``kernels.txt``)
compile        the cpu target's C library (onnxruntime's custom-operator library
               with ``custom_ops``)
rewrite        the fused model (``fused.onnx``)
capture        safe mode: every intermediate of the original on the sample inputs
verify         each fusion on its own activations (numerics, Monte-Carlo, alias, speed),
               failures rolled back alone (:mod:`.safe_mode`, the one runner)
end_to_end     the whole fused model against the original; a failure rolls back all
weights        compressed weights (``options.weights``), each layer verified
=============  ======================================================================

Modules: :mod:`.plan` (the planning every target shares), :mod:`.result` (the result, the
rollback record, model copies, artifacts), :mod:`.stages` (the runner that names, times and
dumps the stages), :mod:`.safe_mode` (the one safe-mode runner of every target: the rollback
loop, the speed policy, the end-to-end check and its fallback; a target supplies its check,
rebuild, end-to-end run and fallback), :mod:`.onnxruntime` (the onnxruntime target's fuse),
:mod:`.cpu` and :mod:`.cpu_engines` (the cpu target and its engine choice on ONNX models),
:mod:`.ort_kernels` (generated kernels as onnxruntime custom operators),
:mod:`.weights` (compressed weights), :mod:`.progressive` (fusion in stages).
"""

from graph_autofusion.pipeline.onnxruntime import fuse_model
from graph_autofusion.pipeline.plan import add_other_targets, plan_for_target
from graph_autofusion.pipeline.result import (
    FuseResult,
    RolledBack,
    clone_model,
    dump_artifact,
    e2e_passed,
    to_json,
    to_onnx_bytes,
)
from graph_autofusion.pipeline.safe_mode import MAX_ROUNDS, run_safe_mode

__all__ = [
    "MAX_ROUNDS",
    "FuseResult",
    "RolledBack",
    "add_other_targets",
    "clone_model",
    "dump_artifact",
    "e2e_passed",
    "fuse_model",
    "plan_for_target",
    "run_safe_mode",
    "to_json",
    "to_onnx_bytes",
]

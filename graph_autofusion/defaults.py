"""The default values of the fusion options, in one place (no imports: every layer reads them).

:class:`~graph_autofusion.options.FuseOptions` is the record built from them; the CLI's
argument defaults, the API's keyword defaults and the pipelines' read these names.
"""

#: Minimum estimated relative saving for a fusion to be planned.
BENEFIT_THRESHOLD = 0.2
#: Cosine-similarity floor of the whole fused model against the original.
E2E_COSINE = 0.9999
#: Automatic clustering limits: nodes per cluster, distinct external inputs per cluster.
MAX_CLUSTER_NODES = 64
MAX_CLUSTER_INPUTS = 8
#: Safe mode's speed check in the pipelines: a fusion fails when slower than this factor of
#: its unfused operators' time.
SPEED_MARGIN = 1.10
#: The speed margin of :func:`graph_autofusion.verify.safety.check_fusion` called on its own
#: (the pipelines pass :data:`SPEED_MARGIN`).
CHECK_FUSION_SPEED_MARGIN = 1.05
#: Monte-Carlo perturbation samples per fusion in safe mode (onnxruntime target).
MC_SAMPLES = 8
#: Rounds of the cpu target's engine measurement on an ONNX model (onnxruntime with our
#: kernels against the torch runner; ``pipeline_cpu_engines``).
ENGINE_TIMING_ROUNDS = 5

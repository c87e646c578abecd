"""The default values of the fusion options, in one place (no imports: every layer reads them).

:class:`~graph_autofusion.options.FuseOptions` is the record built from them; the CLI's
argument defaults, the API's keyword defaults and the pipelines' read these names.
"""

#: Minimum estimated relative saving for a fusion to be planned.
BENEFIT_THRESHOLD = 0.2
#: Safe mode's cosine floor of one fusion's outputs against its unfused operators' (a rule's
#: ``tolerance`` unless it sets its own).
FUSION_COSINE = 0.999
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
#: Monte-Carlo samples of a fusion repeating a signature (``verify.signature``) whose first
#: instance passed all :data:`MC_SAMPLES` in the same fuse (a transformer's later layers).
REPEAT_MC_SAMPLES = 2
#: Safe mode's speed check stops after this many interleaved runs per side when the verdict
#: is clear: the fused median below ``margin`` x :data:`SPEED_CLEAR` of the unfused, or above
#: ``margin`` / :data:`SPEED_CLEAR` (then confirmed by the longer measurement as before).
SPEED_EARLY_RUNS = 7
SPEED_CLEAR = 0.75
#: Rounds of an engine measurement (``verify.speed.SpeedPolicy.engine_times``): the cpu
#: target's on an ONNX model (onnxruntime with our kernels against the torch runner;
#: ``pipeline/cpu_engines.py``) and the torch backend's on a graph's first call (onnxruntime
#: program, torch program, eager; ``torch_compile.CompiledGraph._build_and_choose``).
ENGINE_TIMING_ROUNDS = 5
#: The torch backend builds its torch program (``CompiledGraph._build_and_choose``) only when
#: onnxruntime's program, built first, ran at more than this fraction of eager's time on the
#: first call: chosen only when faster than onnxruntime's by :data:`SPEED_MARGIN`, it would
#: have to run at under 0.68x eager's. Of 153 graphs timed with both (``torch_e2e``,
#: ``torch_route_sweep`` and ``generate_sweep`` results, zoo and held-out, 2026-12-04..06) it
#: never ran faster than onnxruntime, and under 0.75x eager's time on 2 (0.42x and 0.68x,
#: where onnxruntime ran at 0.29x and 0.12x); building it took 2.6 s and 1.1 GB of a GPT-2 s128
#: first call, and set the peak memory of a Llama ``generate()``.
TORCH_PROGRAM_BELOW = 0.75
#: An onnxruntime session without its packed GEMM weights runs at least this much slower than
#: packed (1.14-2.12x on the zoo's Llama, MiniLM, BERT and GPT-2 graphs at s16 and s128,
#: 2026-12-06). A graph whose onnxruntime program, timed unpacked, already runs at
#: :data:`TORCH_PROGRAM_BELOW` times this of eager's time or less is chosen without the packed
#: session (``CompiledGraph._build_and_choose``): packed, it would have run at
#: :data:`TORCH_PROGRAM_BELOW` or less, where the torch program is not built either. The packed
#: copy of the weights is then made only once the graph is hot, never during its first call
#: (it set the peak memory of a compiled ``generate()``: the prefill graph's packed session,
#: ~47 MB on the zoo Llama, opened only to time it).
UNPACKED_SLOWER = 1.13
#: A session packs its weights from its first call when the weights it may pack (GEMM and
#: convolution operands) are fewer bytes than this: opening it again packed once the graph is
#: hot cost its second call a full garbage collection and a new session (243 ms on a tiny
#: Swin-v2 that runs in 0.4 ms, 1.1 ms since: ``benchmarks/first_calls.py``, 2026-12-06), for
#: a packed copy of a few megabytes.
PACK_LATER_MIN_BYTES = 8 << 20
#: The one-call probe deciding whether the unpacked measurement is worth making at all
#: (``CompiledGraph._unpacked_may_lead``: one call each of the unpacked program and eager)
#: measures only when its ratio is within this factor of that threshold; above, the program is
#: packed before its measurement, as before the unpacked timing existed. 1.0: a graph in the
#: band just above the threshold (BERT s16: 0.92x unpacked) would pay two measurements
#: (its first call 1.7 s longer, 2026-12-06) for a choice the unpacked one rarely settles.
UNPACKED_PROBE_SLACK = 1.0
#: A side of an engine measurement whose timed call took this long (seconds) or more is not
#: called untimed again before its next timed call (``SpeedPolicy.engine_times``): the pre-call
#: settles sub-millisecond effects (another runtime's waking threads, cache contents), which
#: a call this long does not feel, and on a large prefill it was half of the measurement.
ENGINE_STEADY_S = 0.02
#: A pause (seconds) before each side's calls in an engine measurement: torch's OpenMP workers
#: spin for a few milliseconds after an eager forward's last parallel operator, and an
#: onnxruntime run in that window competes with them for the cores (MiniLM s16's session:
#: 7.3 ms right after an eager forward, 6.1 after 1 ms, 4.2 after 3, 3.6 after 10 or more;
#: ``/work/scratch/omp_spin.py``, 2026-12-04). Without it the first call of a graph measured
#: its onnxruntime program at up to twice its steady time and chose the torch program.
ENGINE_SETTLE_S = 0.01
#: A compiled graph whose onnxruntime program takes less than this on its first calls is also
#: timed on one thread: onnxruntime's idle workers sleep (the package's sessions do not spin),
#: and waking them costs more than a sub-millisecond graph's parallel work saves (a tiny
#: Qwen2's session step: 0.33 ms on one thread, 0.50 on two). One thread is kept when it is
#: faster by :data:`FEW_THREADS_MARGIN`.
FEW_THREADS_BELOW_S = 1.5e-3
#: ... or whose weights are fewer bytes than this (a small model on a loaded machine, whose
#: first calls take longer than :data:`FEW_THREADS_BELOW_S`).
FEW_THREADS_WEIGHT_BYTES = 8 << 20
#: How much faster one thread must measure than the session's threads to be kept.
FEW_THREADS_MARGIN = 1.05
#: Compressed weights (``FuseOptions.weights``, :mod:`graph_autofusion.pipeline.weights`):
#: the block of ``MatMulNBits`` along K, per form (one fp32 scale per block).
WEIGHTS_BLOCK_SIZE = {"int8": 32, "int4": 32}
#: Whether a form stores a zero point per block (asymmetric) rather than a symmetric range.
WEIGHTS_ZERO_POINT = {"int8": False, "int4": True}
#: ``MatMulNBits``' accuracy_level: 4 quantizes the activations per block to int8 inside the
#: kernel (the fast path on CPU; level 0 dequantizes the weight to fp32 on every call).
WEIGHTS_ACCURACY_LEVEL = 4
#: Matrices with fewer weights stay fp32 (nothing to save, a reason in the report).
WEIGHTS_MIN_ELEMENTS = 4096
#: Safe mode times a compressed layer against fp32 at a decode step's cache pressure: where the
#: candidate layers' fp32 bytes together exceed half the last-level cache (a step streams them
#: from memory), each side's session holds copies of the layer, as many as make this many
#: times the cache in fp32 (each side with its own bytes: the compressed copies may fit)...
WEIGHTS_TIMING_CACHE_MULTIPLE = 2
#: ... at most this many copies and this many fp32 bytes of them.
WEIGHTS_TIMING_MAX_COPIES = 64
WEIGHTS_TIMING_MAX_BYTES = 256 << 20
#: Safe mode's per-layer floor: the compressed layer's output on real activations against its
#: fp32 output (cosine at least, relative L2 error at most).
WEIGHTS_LAYER_COSINE = {"fp16": 0.9999, "int8": 0.999, "int4": 0.99}
WEIGHTS_LAYER_REL_ERR = {"fp16": 0.01, "int8": 0.05, "int4": 0.15}
#: Safe mode's end-to-end floor of a model with compressed weights (lossy by design: its own
#: floor, not :data:`E2E_COSINE`).
WEIGHTS_E2E_COSINE = {"fp16": 0.999, "int8": 0.99, "int4": 0.98}
#: ... and relative L2 error at most (a scaled answer has cosine 1).
WEIGHTS_E2E_REL_ERR = {"fp16": 0.05, "int8": 0.1, "int4": 0.5}

# ----------------------------------------------------------------- torch entry points
#: Compiled variants a drop-in fused module's forward may have before Dynamo runs the calls
#: matching none of them in eager (torch's own default, 8, is per function and too few for a
#: sliding-window decoder's generate(): Gemma-3 with a window of 8 needs 10 for prompts of 3
#: to 33 tokens); ``torch.compile(..., recompile_limit=)`` applies it to that forward only.
RECOMPILE_LIMIT = 32

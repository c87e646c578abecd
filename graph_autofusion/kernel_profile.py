"""``profile_fusion_kernel`` (F15, F17): one fused kernel against its unfused operators.

    profile_kernel(result, "bias_gelu@/layer.0/Mul_1", "host")
    # {"kernel_us", "unfused_us", "speedup", "bytes", "achieved_gb_s", "bandwidth_gb_s",
    #  "bandwidth_fraction", ...}

Both sides run on the sample inputs' real activations (captured once with torch), alternating,
median of ``runs``. Bytes are what the kernel must move: its inputs once and its outputs once.
"""

from __future__ import annotations

import statistics
from typing import Any

from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.pipeline.cpu_kernels import kernel_and_operators
from graph_autofusion.runtime.timing import median_us


def profile_kernel(result: Any, key: str | int, hardware: Any, *, runs: int = 20) -> dict[str, Any]:
    """Profile one fused group of a cpu-target result (by candidate key or index)."""
    import torch

    from graph_autofusion.runtime.torch_runtime import TorchRunner  # torch: optional, heavy

    if getattr(result, "program", None) is None:
        raise GraphAutoFusionError(
            "profile_fusion_kernel needs a fuse() result of the cpu target run by the torch "
            "engine (this one runs in onnxruntime: time it with verify_performance)"
        )
    lows = list(result.lowered)
    if isinstance(key, int):
        if not 0 <= key < len(lows):
            raise GraphAutoFusionError(f"kernel index {key} out of range (0..{len(lows) - 1})")
        low = lows[key]
    else:
        found = [x for x in lows if x.key == key]
        if not found:
            raise GraphAutoFusionError(f"no fused kernel {key!r}; fused: {[x.key for x in lows]}")
        low = found[0]
    ref = TorchRunner(result.original)
    acts = ref.run(result.feeds, keep_all=True)
    step, args, unfused = kernel_and_operators(result, low, acts, ref.opset)
    with torch.no_grad():
        outs = step(None, *args)
        outs = outs if isinstance(outs, tuple | list) else (outs,)
        k_times, u_times = [], []
        for _ in range(3):  # alternate, so both see the same machine state
            k_times.append(
                median_us(lambda: step(None, *args), max(1, runs // 3), key=low.key, side="fused")
            )
            u_times.append(
                median_us(lambda: unfused(*args), max(1, runs // 3), key=low.key, side="unfused")
            )
        kernel_us, unfused_us = statistics.median(k_times), statistics.median(u_times)
    group = low.payload
    nbytes = sum(
        int(a.numel() * a.element_size()) for a in args if isinstance(a, torch.Tensor)
    ) + sum(int(o.numel() * o.element_size()) for o in outs)
    profile = load_profile(hardware) if not hasattr(hardware, "memory_bandwidth_gbs") else hardware
    bw = float(getattr(profile, "memory_bandwidth_gbs", 0.0) or 0.0)
    achieved = nbytes / (kernel_us * 1e-6) / 1e9 if kernel_us > 0 else 0.0
    return {
        "key": low.key,
        "kernel": group.kernel.name,
        "signature": group.kernel.signature(),
        "fused_ops": list(group.kernel.fused_ops),
        "shapes": [list(a.shape) for a in args if isinstance(a, torch.Tensor)],
        "kernel_us": kernel_us,
        "unfused_us": unfused_us,
        "speedup": unfused_us / kernel_us if kernel_us > 0 else None,
        "bytes": nbytes,
        "achieved_gb_s": achieved,
        "bandwidth_gb_s": bw,
        "bandwidth_fraction": achieved / bw if bw else None,
        "profile": getattr(profile, "name", str(hardware)),
    }

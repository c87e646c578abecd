"""What operators compute in whatever their inputs' float type: the planner's mixed-precision
constraint (``keep_fp32``) and safe mode's float16 range check both ask."""

from __future__ import annotations

__all__ = ["FP32_ACCUMULATING"]

#: Ops whose onnxruntime kernels accumulate in float32 even on float16 tensors.
FP32_ACCUMULATING = {
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
}

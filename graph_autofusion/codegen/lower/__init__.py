"""Lower a planned group (a rule match or an automatic cluster) into one :class:`Kernel`.

    lowering = lower_group(nodes, outputs, binding, name="k0")
    lowering.kernel              # the kernel IR
    lowering.prologue            # a contraction the runtime's own GEMM computes first, or None

What a group may hold (everything else is refused with a :class:`KernelReason` code, at
planning time, so the planner never plans what this target cannot execute):

* elementwise and broadcast operators (arithmetic, comparisons, ``Where``, ``Cast``,
  activations with their attributes, ``Clip``, ``PRelu``, ``Dropout`` at inference, ``Expand``);
* reductions (``ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2``) over any axes, and the
  normalizations ``Softmax``, ``LogSoftmax``, ``LayerNormalization``,
  ``SimplifiedLayerNormalization`` / ``RMSNormalization``, decomposed into reductions with
  their prologue and epilogue; every reduction of a group reduces the same axes;
* layout operators on a group input (``Transpose``, ``Reshape``, ``Flatten``, ``Unsqueeze``,
  ``Squeeze``, ``Slice``, ``Gather`` of one constant index), which become strided views, and
  leading-1 reshapes anywhere (a no-op under broadcasting);
* a first ``MatMul``/``Gemm``/``Conv`` whose output feeds the rest: the runtime's GEMM
  computes it, the kernel is its epilogue (one pass over the product).

The package, by operator kind: :mod:`.common` (refusal reasons, storage types, the result),
:mod:`.builder` (instructions, loads, layout views), :mod:`.nodes` (elementwise operators and
the per-node dispatch), :mod:`.activations`, :mod:`.reductions` (and the normalizations),
:mod:`.group` (a whole group into one kernel).
"""

from graph_autofusion.codegen.lower.common import (
    CONTRACTIONS,
    GroupLowering,
    KernelReason,
    KernelRefused,
    storage_of,
)
from graph_autofusion.codegen.lower.group import lower_group

__all__ = [
    "CONTRACTIONS",
    "GroupLowering",
    "KernelReason",
    "KernelRefused",
    "lower_group",
    "storage_of",
]

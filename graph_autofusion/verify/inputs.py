"""Safe mode's sample inputs: :func:`generate_inputs` of :mod:`graph_autofusion.samples.inputs`,
re-exported here where it has always been importable, and :func:`retry_longer`, the same
inputs generated again with longer dynamic axes, :func:`finite_outputs`, the same inputs
generated again where they make an output NaN everywhere, and :func:`other_shape_inputs`, safe
mode's second shape."""

from graph_autofusion.samples.inputs import (
    finite_outputs,
    generate_inputs,
    nonfinite_outputs,
    other_shape_inputs,
    retry_longer,
)

__all__ = [
    "finite_outputs",
    "generate_inputs",
    "nonfinite_outputs",
    "other_shape_inputs",
    "retry_longer",
]

"""Safe mode's sample inputs: :func:`generate_inputs` of :mod:`graph_autofusion.samples.inputs`,
re-exported here where it has always been importable, and :func:`retry_longer`, the same
inputs generated again with longer dynamic axes, and :func:`other_shape_inputs`, safe mode's
second shape."""

from graph_autofusion.samples.inputs import generate_inputs, other_shape_inputs, retry_longer

__all__ = ["generate_inputs", "other_shape_inputs", "retry_longer"]

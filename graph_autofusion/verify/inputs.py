"""Safe mode's sample inputs: :func:`generate_inputs` of :mod:`graph_autofusion.samples.inputs`,
re-exported here where it has always been importable."""

from graph_autofusion.samples.inputs import generate_inputs

__all__ = ["generate_inputs"]

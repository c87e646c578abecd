"""The sample-input helpers of :mod:`graph_autofusion.samples.sample_inputs`, re-exported here
where they have always been importable (the same public names, one list of them)."""

from graph_autofusion.samples.sample_inputs import *  # noqa: F403 - its __all__, below
from graph_autofusion.samples.sample_inputs import __all__  # noqa: F401 - the same names

"""The sample-input helpers of :mod:`graph_autofusion.samples.sample_inputs`, re-exported here
where they have always been importable."""

from graph_autofusion.samples.sample_inputs import (
    MAX_INPUT_BYTES,
    ROLES,
    RoleContext,
    SampleInputs,
    check_input_size,
    derive_shape_inputs,
    find_roles,
    is_generated,
    own_copy,
    run_failure,
    source_of,
)

__all__ = [
    "MAX_INPUT_BYTES",
    "ROLES",
    "RoleContext",
    "SampleInputs",
    "check_input_size",
    "derive_shape_inputs",
    "find_roles",
    "is_generated",
    "own_copy",
    "run_failure",
    "source_of",
]

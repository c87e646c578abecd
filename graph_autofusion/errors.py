"""Error hierarchy: every error raised on purpose derives from GraphAutoFusionError."""

from __future__ import annotations


class GraphAutoFusionError(Exception):
    """Root of all graph-autofusion errors."""


class ModelLoadError(GraphAutoFusionError):
    """A model file or object could not be read (truncated, not ONNX, missing external data)."""


class ModelWriteError(GraphAutoFusionError):
    """A model could not be written; nothing was left at the destination."""


class IRError(GraphAutoFusionError):
    """The graph IR is inconsistent (verifier failure, bad mutation)."""


class CycleError(IRError):
    """The graph contains a cycle, or a rewrite would create one."""


class UnsupportedOperatorError(GraphAutoFusionError):
    """An operator has no implementation in the backend asked to execute it."""


class FrontendError(GraphAutoFusionError):
    """A model could not be converted into the graph IR."""


class TextParseError(GraphAutoFusionError):
    """The IR text form could not be parsed; the message names the line."""


class SampleInputError(GraphAutoFusionError):
    """The sample inputs (generated or given) cannot be made, or the original model fails on
    them; the message names the input and points to ``--inputs`` / ``sample_inputs=``."""


class PathError(GraphAutoFusionError, OSError):
    """A path given by the user is missing, a directory, unreadable or not writable."""


class InputShapeError(SampleInputError, ValueError):
    """A sample input's shape disagrees with the model's declared input (rank, a static dim,
    or a symbol bound to two values); the message names the input."""


class MissingFileError(PathError, FileNotFoundError):
    """A file the model needs is not there (a fused model's custom-operator library)."""


class MissingInputError(GraphAutoFusionError, KeyError):
    """A graph input was not given when running a model (the message lists the inputs)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


class OptionsError(GraphAutoFusionError, ValueError):
    """An option has a value outside the accepted ones (the message lists them)."""


class AutofusionWarning(UserWarning):
    """A graph (or part of one) runs in eager because the backend could not compile it."""

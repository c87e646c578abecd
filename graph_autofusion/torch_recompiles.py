"""A fused module's forward that reaches Dynamo's recompile limit: one warning, not silence.

Dynamo compiles a frame again for every guard it fails (a new sequence length before a
dimension turns dynamic, a Python branch on a size: the sliding-window mask of Gemma-3,
Starcoder2 or Cohere2 decides on the cache length against the window). At the recompile
limit it stops compiling that code and every later call runs in eager, with only a log line
from torch. The drop-in module compiles its forward with a higher limit of its own
(``defaults.RECOMPILE_LIMIT``, per region: ``torch.compile(..., recompile_limit=)``), and
:func:`watch` turns torch's log line about it into one :class:`AutofusionWarning` per fused
module naming the model, the limit and Dynamo's last reason; ``FusionInfo.eager_reason``
keeps it for the report.

torch's line names the function (``'wrapper' (file:line)``) and the limit in force; the
fused forward is a code object of its own (``torch_module._own_code``) with its source's
name and place, and its region's limit is the one in the line, so a line from the user's own
``torch.compile`` of the same class at torch's default limit is not taken for ours.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from types import CodeType
from typing import Any

from graph_autofusion import defaults
from graph_autofusion.torch_compile import AutofusionWarning

#: The logger Dynamo reports a reached recompile limit on (torch/_dynamo/convert_frame.py).
DYNAMO_LOGGER = "torch._dynamo.convert_frame"
_MESSAGE = "torch._dynamo hit config.%s"


def code_key(code: CodeType) -> str:
    """How torch's recompile-limit line names a function."""
    return f"'{code.co_name}' ({code.co_filename}:{code.co_firstlineno})"


class _Watch(logging.Filter):
    """Passes every record on; one that says a watched forward reached its limit warns."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: dict[str, weakref.WeakSet[Any]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if str(record.msg).startswith(_MESSAGE) and isinstance(args, tuple) and len(args) >= 4:
            limit_type, limit, where, reason = args[:4]
            if limit_type == "recompile_limit" and limit == defaults.RECOMPILE_LIMIT:
                for info in list(self.watched.get(str(where), ())):
                    _warn(info, limit, str(reason))
        return True


_WATCH = _Watch()


def watch(code: CodeType, info: Any) -> None:
    """Warn once (and set ``info.eager_reason``) when the forward with ``code`` reaches its
    recompile limit; ``info``: the fused module's ``FusionInfo`` (held weakly)."""
    logger = logging.getLogger(DYNAMO_LOGGER)
    if _WATCH not in logger.filters:
        logger.addFilter(_WATCH)
    _WATCH.watched.setdefault(code_key(code), weakref.WeakSet()).add(info)


def _warn(info: Any, limit: Any, reason: str) -> None:
    if info.eager_reason:
        return
    reason = " ".join(reason.split())
    info.eager_reason = (
        f"Dynamo's recompile limit ({limit} compiled variants of the forward) was reached; "
        f"calls that match none of them run in eager (last reason: {reason})"
    )
    warnings.warn(
        f"autofusion: the fused {info.source_name} module's forward reached Dynamo's recompile limit "
        f"({limit}); calls whose shapes or Python values match none of its compiled variants "
        f"now run in eager (last reason: {reason}; TORCH_LOGS=recompiles lists every "
        f"variant's reason)",
        AutofusionWarning,
        stacklevel=2,
    )

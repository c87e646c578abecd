"""A function compiled with our backend that reaches Dynamo's recompile limit: one warning.

Dynamo compiles a frame again for every guard it fails (a new sequence length before a
dimension turns dynamic, a Python branch on a size: the sliding-window mask of Gemma-3,
Starcoder2 or Cohere2 decides on the cache length against the window). At the recompile
limit it stops compiling that code and every later call that matches none of the compiled
variants runs in eager, with only a log line from torch. This module turns that line into
one :class:`~graph_autofusion.errors.AutofusionWarning` per backend and frame, naming the
function, the limit and Dynamo's last reason; ``BackendConfig.eager_reason`` keeps it for
the report (``fused.autofusion.eager_reason`` on a drop-in module).

Whose frame it is: the backend notes Dynamo's frame id (one per code object) and the
function's name and place each time it is handed a graph (:func:`note_frame`); torch writes
its line, which names the function, inside that frame's compile context, so the current
compile id names the frame. A frame after a graph break (Dynamo's resume function) is a
frame of its own, noted when its graph reaches the backend. The drop-in module's forward is a
code object of its own (``torch_module._own_code``) compiled with a higher limit of its own
(``defaults.RECOMPILE_LIMIT``), so a user's ``torch.compile`` of the same class is another
frame.

torch's log record is what is read: with Dynamo's logger silenced below WARNING (or disabled
by ``logging.config.dictConfig``), the warning and ``eager_reason`` go with torch's line.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any

import torch

from graph_autofusion.errors import AutofusionWarning

#: The logger Dynamo reports a reached recompile limit on (torch/_dynamo/convert_frame.py).
DYNAMO_LOGGER = "torch._dynamo.convert_frame"
_MESSAGE = "torch._dynamo hit config.%s"

#: Every backend that compiled a graph (``BackendConfig``, by id), held weakly.
_CONFIGS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _frame_id() -> int | None:
    cid = torch._guards.CompileContext.current_compile_id()
    return None if cid is None else cid.frame_id


def code_key(code: Any) -> str:
    """How torch's recompile-limit line names a function."""
    return f"'{code.co_name}' ({code.co_filename}:{code.co_firstlineno})"


def note_frame(config: Any) -> None:
    """Called by the backend with each graph Dynamo hands it: remember the frame it is of, as
    Dynamo's frame id and the function's name and place (``torch._dynamo.reset()`` starts
    the ids again from 0)."""
    frame = _frame_id()
    tracing = torch._guards.TracingContext.try_get()
    traced = getattr(tracing, "traced_code", None)
    if frame is None or not traced:
        return
    config.frames.setdefault((frame, code_key(traced[0])), "")
    _CONFIGS[id(config)] = config
    logger = logging.getLogger(DYNAMO_LOGGER)
    if _WATCH not in logger.filters:
        logger.addFilter(_WATCH)


class _Watch(logging.Filter):
    """Passes every record on; one saying a frame of ours reached its limit also warns."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if str(record.msg).startswith(_MESSAGE) and isinstance(args, tuple) and len(args) >= 4:
            frame = (_frame_id(), str(args[2]))
            for config in list(_CONFIGS.values()):
                if config.frames.get(frame) == "":  # ours, not warned yet
                    _warn(config, frame, *args[:4])
        return True


_WATCH = _Watch()


def _warn(config: Any, frame: tuple, limit_type: Any, limit: Any, where: Any, reason: Any) -> None:
    reason = " ".join(str(reason).split())
    what = config.label or f"{where}, compiled with the autofusion backend,"
    config.eager_reason = config.frames[frame] = (
        f"Dynamo's {limit_type} ({limit}) was reached on {where}; calls that match none of "
        f"its compiled variants run in eager (last reason: {reason})"
    )
    warnings.warn(
        f"autofusion: {what} reached Dynamo's {limit_type} ({limit}); calls whose shapes or "
        f"Python values match none of its compiled variants now run in eager (last reason: "
        f"{reason}; TORCH_LOGS=recompiles lists every variant's reason)",
        AutofusionWarning,
        stacklevel=2,
    )

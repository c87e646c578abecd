"""Denormal floats flushed to zero on the calling thread, for the length of a call.

    with flushing_denormals():
        session.run(None, feeds)

A float32 below 1.18e-38 in magnitude (a denormal) costs an x86 core a microcode assist of
about a hundred cycles in every multiply or add that reads or writes one. Models with large
attention logits or GELU tails make them by the million (a softmax row's far tail, ``exp`` of
-90): onnxruntime's ``Attention`` on the zoo MiniLM at s128 ran 2.6x slower with them than with
flush-to-zero (FTZ) and denormals-are-zero (DAZ) set. Flushing changes a result only where a
value is itself below 1.18e-38.

onnxruntime sets both bits on its pool threads for a session opened with
``session.set_denormal_as_zero``, and on the thread that opens the first session of a process,
for good. The second is a side effect on the user's thread that this project does not want, and
the calling thread runs its share of every parallel operator: :func:`flushing_denormals` sets the
two bits of the SSE control register (MXCSR) for one call and puts the register back as it was,
so the user's own code (torch eager, numpy) keeps IEEE semantics.

x86-64 Linux only (glibc's ``fegetmode``/``fesetmode``: ``femode_t`` holds MXCSR at byte 4,
and setting the modes leaves the exception flags as they are); elsewhere the context does
nothing, :data:`SUPPORTED` is ``False`` and no session flushes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: ``FuseOptions.denormals``: ``flush`` (the sessions that serve a fused model flush denormal
#: floats to zero) or ``keep`` (IEEE denormals, onnxruntime's default)
DENORMAL_MODES = ("flush", "keep")
#: The metadata key under which a saved fused model records the mode it was verified and
#: serves with (``fused_session``'s default)
METADATA_KEY = "graph_autofusion.denormals"
#: MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) bits
FTZ_DAZ = 0x8040
_MODE_BYTES = 8  # sizeof(femode_t) on x86-64 glibc
_MXCSR_AT = 4  # offsetof(femode_t, __mxcsr)


def _libm() -> ctypes.CDLL | None:
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    name = ctypes.util.find_library("m") or "libm.so.6"
    try:
        lib = ctypes.CDLL(name)
        lib.fegetmode.argtypes = lib.fesetmode.argtypes = [ctypes.c_void_p]
        lib.fegetmode.restype = lib.fesetmode.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


_LIBM = _libm()
#: Whether this platform can flush denormals per call (x86-64 Linux)
SUPPORTED = _LIBM is not None


def denormals_flushed(mode: str) -> bool:
    """Whether ``mode`` (one of :data:`DENORMAL_MODES`) flushes.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in DENORMAL_MODES:
        raise ValueError(f"unknown denormals mode {mode!r}; known: {list(DENORMAL_MODES)}")
    return mode == "flush"


def mxcsr() -> int | None:
    """The calling thread's MXCSR, or ``None`` where unsupported."""
    got = _modes()
    return None if got is None else got[1]


def _modes() -> tuple[ctypes.Array, int] | None:
    """The calling thread's floating-point modes (``femode_t``) and the MXCSR word in them."""
    if _LIBM is None:
        return None
    env = ctypes.create_string_buffer(_MODE_BYTES)
    if _LIBM.fegetmode(env) != 0:
        return None
    return env, int.from_bytes(env.raw[_MXCSR_AT : _MXCSR_AT + 4], "little")


def _set_word(env: ctypes.Array, word: int) -> None:
    ctypes.memmove(ctypes.addressof(env) + _MXCSR_AT, word.to_bytes(4, "little"), 4)
    _LIBM.fesetmode(env)


def _restore_bits(saved: int) -> None:
    """FTZ and DAZ as they are in the MXCSR word ``saved``; the other modes as they are now."""
    got = _modes()
    if got is not None and got[1] & FTZ_DAZ != saved & FTZ_DAZ:
        _set_word(got[0], (got[1] & ~FTZ_DAZ) | (saved & FTZ_DAZ))


@contextmanager
def flushing_denormals(on: bool = True) -> Iterator[None]:
    """Flush-to-zero and denormals-are-zero on the calling thread inside the block (``on``),
    the thread's own setting back after it, whatever the block raises."""
    got = _modes() if on else None
    if got is None or got[1] & FTZ_DAZ == FTZ_DAZ:  # off, unsupported, or the user's own
        yield
        return
    env, word = got
    _set_word(env, word | FTZ_DAZ)
    try:
        yield
    finally:  # the two bits as they were (the modes only: raised flags stay raised)
        _restore_bits(word)


@contextmanager
def keeping_denormal_mode() -> Iterator[None]:
    """The calling thread's two bits as they were before the block, whatever it set (an
    onnxruntime session opened with ``session.set_denormal_as_zero`` sets them for good on the
    thread that opens a process's first session)."""
    before = mxcsr()
    try:
        yield
    finally:
        if before is not None:
            _restore_bits(before)

"""The hardware-profile file format, checked: required and optional keys with their types,
the positive numbers, the measured curves and per-operator tables; every problem is a
:class:`HardwareError` naming the file, the key and its line."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from typing import Any

from graph_autofusion.errors import GraphAutoFusionError

KINDS = ("npu", "gpu", "cpu")


SCHEMA_VERSION = 1


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "description": str,
    "kind": str,
    "memory_bandwidth_gbs": (int, float),
    "peak_gflops": dict,
    "launch_overhead_us": (int, float),
    "local_memory_kb": (int, float),
    "cores": int,
    "vector_width_bytes": int,
}


_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "l1_kb": (int, float),
    "l2_kb": (int, float),
    "extra": dict,
    "op_overhead_us": dict,
    "sources": dict,
    "schema_version": int,
}


_POSITIVE = (
    "memory_bandwidth_gbs",
    "launch_overhead_us",
    "local_memory_kb",
    "cores",
    "vector_width_bytes",
    "l1_kb",
    "l2_kb",
)


class HardwareError(GraphAutoFusionError):
    """A hardware profile is unknown, malformed or could not be written."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_curve(points: Any) -> bool:
    """``[[elements, ns], ...]``: at least one pair, elements increasing, both positive."""
    if not isinstance(points, list | tuple) or not points:
        return False
    last = 0.0
    for p in points:
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_number(x) for x in p)):
            return False
        if not (p[0] > last and p[1] > 0):
            return False
        last = p[0]
    return True


#: ``extra`` entries that map operator names to calibrated numbers (host calibration): entry
#: -> (check of one ``(operator, value)`` pair, what the entry must be)
_OP_TABLES: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "op_ns_per_element": (
        lambda op, ns: isinstance(op, str) and _is_number(ns) and ns > 0,
        "must map operator names to positive ns",
    ),
    "op_ns_per_row": (
        lambda op, ns: isinstance(op, str) and bool(op.strip()) and _is_number(ns) and ns >= 0,
        "must map operator names to ns >= 0",
    ),
    "op_ns_per_element_curve": (
        lambda op, pts: isinstance(op, str) and bool(op.strip()) and _is_curve(pts),
        "must map operator names to lists of [elements, ns per element] pairs, elements "
        "increasing, both positive",
    ),
}


def _clip(v: Any) -> str:
    """A short repr of ``v`` for messages (a hostile value may be huge)."""
    return reprlib.repr(v)


def _type_name(t: type | tuple[type, ...]) -> str:
    if t == (int, float):
        return "a finite number"
    return {str: "a string", int: "an integer", dict: "a mapping"}.get(t, str(t))  # type: ignore[arg-type]


def validate_profile_data(data: Any, where: str, lines: dict[str, int]) -> None:
    """Check a profile mapping; raise HardwareError naming ``where``, line, key and problem."""

    def fail(key: str | None, problem: str) -> None:
        line = lines.get(key or "", lines.get("", 0))
        loc = f"{where}, line {line}" if line else where
        raise HardwareError(f"{loc}: key {key!r}: {problem}" if key else f"{loc}: {problem}")

    if not isinstance(data, dict):
        fail(None, "a hardware profile must be a YAML mapping of keys to values")
    for key in data:
        if not isinstance(key, str) or (key not in _REQUIRED and key not in _OPTIONAL):
            known = ", ".join([*_REQUIRED, *_OPTIONAL])
            fail(str(key), f"unknown key (known keys: {known})")
    for key in _REQUIRED:
        if key not in data:
            fail(key, "required key is missing")
    for key, typ in {**_REQUIRED, **_OPTIONAL}.items():
        if key not in data or (key in _OPTIONAL and data[key] is None):
            continue
        v = data[key]
        ok = _is_number(v) if typ == (int, float) else isinstance(v, typ)
        if typ is int and isinstance(v, bool):
            ok = False
        if not ok:
            fail(key, f"must be {_type_name(typ)}, got {type(v).__name__} {_clip(v)}")
    if data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        fail("schema_version", f"unsupported version {data['schema_version']}")
    for key in ("name", "description"):
        if not data[key].strip():
            fail(key, "must not be empty")
    if data["kind"] not in KINDS:
        fail("kind", f"must be one of {', '.join(KINDS)}, got {_clip(data['kind'])}")
    for key in _POSITIVE:
        if data.get(key) is not None and not data[key] > 0:
            fail(key, f"must be positive, got {_clip(data[key])}")
    peaks = data["peak_gflops"]
    if "f32" not in peaks:
        fail("peak_gflops", "must list 'f32' (the fallback for dtypes not listed)")
    for dt, v in peaks.items():
        if not isinstance(dt, str) or not _is_number(v) or not v > 0:
            fail("peak_gflops", f"entry {_clip(dt)}: must be a positive number, got {_clip(v)}")
    for k, v in (data.get("extra") or {}).items():
        if k in _OP_TABLES:
            entry_ok, what = _OP_TABLES[k]
            if not isinstance(v, dict) or not all(entry_ok(op, x) for op, x in v.items()):
                fail("extra", f"entry {_clip(k)}: {what}")
            continue
        if not isinstance(k, str) or not (_is_number(v) or isinstance(v, (str, bool))):
            fail("extra", f"entry {_clip(k)}: values must be numbers, strings or booleans")
    for k, v in (data.get("op_overhead_us") or {}).items():
        if not isinstance(k, str) or not k.strip():
            fail("op_overhead_us", f"entry {_clip(k)}: keys must be operator type names")
        if not _is_number(v) or not v > 0:
            fail(
                "op_overhead_us",
                f"entry {_clip(k)}: must be a positive number (us), got {_clip(v)}",
            )
    sources = data.get("sources") or {}
    if not isinstance(sources, dict):
        fail("sources", "must be a mapping")
    for k, v in sources.items():
        head = str(k).split(".", 1)[0]
        if head not in _REQUIRED and head not in _OPTIONAL:
            fail("sources", f"entry {_clip(k)} names no profile key")
        if not isinstance(v, str) or not v.strip():
            fail("sources", f"entry {_clip(k)}: must be a non-empty string")

"""The record of a hardware profile (:class:`HardwareProfile`): the numbers the cost model needs
about a machine, with their YAML form. Reading, validating and finding profiles is
:mod:`graph_autofusion.cost.hardware`; measuring the host's is
:mod:`graph_autofusion.cost.calibrate`, which makes one of these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from graph_autofusion.cost.profile_schema import SCHEMA_VERSION, validate_profile_data

__all__ = ["HardwareProfile"]

_DTYPE_ALIASES = {
    "float": "f32",
    "float32": "f32",
    "fp32": "f32",
    "float16": "f16",
    "half": "f16",
    "fp16": "f16",
    "bfloat16": "bf16",
    "int8": "i8",
    "uint8": "i8",
    "u8": "i8",
    "double": "f64",
    "float64": "f64",
    "fp64": "f64",
    "tf32": "tf32",
}


@dataclass(frozen=True)
class HardwareProfile:
    """One machine's performance facts (units in the field names; see the module docstring).

    Attributes:
        name: Profile name (``a100``, ``host`` ...).
        description: One line naming the exact part the numbers describe.
        kind: ``"npu"``, ``"gpu"`` or ``"cpu"``.
        memory_bandwidth_gbs: Main memory (HBM/DRAM) bandwidth in GB/s (1e9 bytes per second).
        peak_gflops: Peak rate by dtype short name (``f32``, ``f16``, ``bf16``, ``i8`` ...) in
            GFLOP/s (GOP/s for integers).
        launch_overhead_us: Fixed cost of one kernel launch or operator dispatch, microseconds.
        local_memory_kb: On-chip working memory per core in KiB: Ascend Unified Buffer, GPU
            shared memory per thread block, CPU L2 per core.
        cores: Ascend AI cores, GPU SMs, CPU cores.
        vector_width_bytes: Bytes processed by one vector instruction (CPU SIMD register,
            Ascend vector unit per cycle, GPU warp of 32 x 4-byte lanes).
        l1_kb: Ascend L1 buffer per core, GPU L1/shared per SM, CPU L1d per core (KiB).
        l2_kb: Ascend L2 total, GPU L2 total, CPU L2 per core (KiB).
        extra: Free-form additional facts (Ascend L0A/L0B/L0C sizes, CPU L3, frequencies).
        sources: Field name (or ``peak_gflops.f16``, ``extra.l0_a_kb``) -> where it comes from.
        op_overhead_us: Operator type (``Shape``, ``Slice`` ...) -> fixed cost of dispatching
            one such operator, microseconds; measured per type by the host calibration. Empty
            in shipped profiles: every operator then costs ``launch_overhead_us``.
    """

    name: str
    description: str
    kind: str
    memory_bandwidth_gbs: float
    peak_gflops: dict[str, float]
    launch_overhead_us: float
    local_memory_kb: float
    cores: int
    vector_width_bytes: int
    l1_kb: float | None = None
    l2_kb: float | None = None
    extra: dict = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    op_overhead_us: dict[str, float] = field(default_factory=dict)

    def bandwidth_bytes_per_s(self) -> float:
        """Main-memory bandwidth in bytes per second."""
        return float(self.memory_bandwidth_gbs) * 1e9

    def peak_flops_per_s(self, dtype: str = "f32") -> float:
        """Peak FLOP/s (OP/s) for ``dtype``; falls back to ``f32`` when the dtype is not listed.

        ``dtype`` may be a short name (``f16``), a long name (``float16``, ``bfloat16``) or an
        object with a ``short`` attribute (the IR's ``DType``).
        """
        key = _dtype_key(dtype)
        value = self.peak_gflops.get(key)
        if value is None:
            value = self.peak_gflops["f32"]
        return float(value) * 1e9

    def launch_overhead_s(self) -> float:
        """Per-launch / per-dispatch overhead in seconds."""
        return float(self.launch_overhead_us) * 1e-6

    def op_overhead_s(self, op_type: str | None = None) -> float:
        """Dispatch overhead of one ``op_type`` operator in seconds: its ``op_overhead_us``
        entry when the profile has one, else :meth:`launch_overhead_s`."""
        us = (self.op_overhead_us or {}).get(op_type) if op_type else None
        return float(us if us is not None else self.launch_overhead_us) * 1e-6

    def local_memory_bytes(self) -> int:
        """On-chip working memory per core in bytes (KiB x 1024)."""
        return int(round(float(self.local_memory_kb) * 1024))

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping in file order (what :func:`save_profile` writes)."""
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "description": self.description,
            "kind": self.kind,
            "memory_bandwidth_gbs": _num(self.memory_bandwidth_gbs),
            "peak_gflops": {k: _num(v) for k, v in self.peak_gflops.items()},
            "launch_overhead_us": _num(self.launch_overhead_us),
            "local_memory_kb": _num(self.local_memory_kb),
            "cores": int(self.cores),
            "vector_width_bytes": int(self.vector_width_bytes),
        }
        if self.l1_kb is not None:
            out["l1_kb"] = _num(self.l1_kb)
        if self.l2_kb is not None:
            out["l2_kb"] = _num(self.l2_kb)
        if self.extra:
            out["extra"] = _plain(self.extra)
        if self.op_overhead_us:
            out["op_overhead_us"] = {k: _num(v) for k, v in self.op_overhead_us.items()}
        if self.sources:
            out["sources"] = dict(self.sources)
        return out

    def to_yaml(self) -> str:
        """The profile as YAML text (validated first)."""
        data = self.to_dict()
        validate_profile_data(data, f"profile {self.name!r}", {})
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)

    def summary_lines(self) -> list[str]:
        """Human-readable lines for ``hardware show``."""
        peaks = ", ".join(f"{k} {v:,.0f}" for k, v in self.peak_gflops.items())
        lines = [
            f"{self.name}: {self.description}",
            f"  kind                {self.kind}",
            f"  memory bandwidth    {self.memory_bandwidth_gbs:,.1f} GB/s",
            f"  peak GFLOP/s        {peaks}",
            f"  launch overhead     {self.launch_overhead_us:g} us",
            f"  local memory        {self.local_memory_kb:g} KiB per core",
            f"  cores               {self.cores}",
            f"  vector width        {self.vector_width_bytes} bytes",
        ]
        if self.l1_kb is not None:
            lines.append(f"  l1                  {self.l1_kb:g} KiB")
        if self.l2_kb is not None:
            lines.append(f"  l2                  {self.l2_kb:g} KiB")
        for k, v in self.extra.items():
            if k == "op_ns_per_element_curve" and isinstance(v, dict):
                sizes = sorted({int(p[0]) for pts in v.values() for p in pts})
                v = f"{len(v)} operators at {', '.join(str(n) for n in sizes)} elements"
            lines.append(f"  extra.{k:<14} {v}")
        if self.op_overhead_us:
            per_op = ", ".join(f"{k} {v:g}" for k, v in self.op_overhead_us.items())
            lines.append(f"  op overhead (us)    {per_op}")
        if self.sources:
            lines.append("  sources:")
            lines.extend(f"    {k}: {v}" for k, v in self.sources.items())
        return lines


def _plain(v: Any) -> Any:
    """A deep copy of mappings and sequences as plain dicts and lists (YAML- and JSON-ready)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _num(v: float) -> float | int:
    f = float(v)
    return int(f) if f.is_integer() and abs(f) < 1e15 else f


def _dtype_key(dtype: Any) -> str:
    short = getattr(dtype, "short", None)
    key = str(short if short is not None else dtype).strip().lower()
    return _DTYPE_ALIASES.get(key, key)

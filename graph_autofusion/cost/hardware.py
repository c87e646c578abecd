"""Hardware profiles: the numbers the cost model needs about a machine, kept as YAML data files.

A profile records main-memory bandwidth, peak arithmetic rate per dtype, the fixed cost of one
kernel launch or operator dispatch, the on-chip working memory a fused kernel can keep its
intermediates in, and a few cache and core facts. Shipped profiles live in
``graph_autofusion/cost/profiles/<name>.yaml``; each number has a ``sources`` entry saying where
it comes from. ``host`` is measured on the running machine by
:func:`graph_autofusion.cost.calibrate.calibrate_host` and cached under :func:`hardware_dir`.

Schema (one YAML mapping; see ``docs/hardware.md`` for the table)::

    name: a100                      # str
    description: NVIDIA A100 ...    # str
    kind: gpu                       # npu | gpu | cpu
    memory_bandwidth_gbs: 2039      # GB/s (1e9 bytes/s), main memory (HBM/DRAM)
    peak_gflops: {f32: 19500, f16: 312000}   # GFLOP/s (GOP/s for integer dtypes)
    launch_overhead_us: 4.0         # microseconds per kernel launch / operator dispatch
    local_memory_kb: 163            # KiB: Ascend UB / GPU shared memory per block / CPU L2 per core
    cores: 108                      # AI cores / SMs / CPU cores
    vector_width_bytes: 128         # bytes one vector instruction processes
    l1_kb: 192                      # optional, KiB
    l2_kb: 40960                    # optional, KiB
    extra: {...}                    # optional: scalars (Ascend L0A/L0B/L0C ...) and the host
                                    # calibration's op_ns_per_element (op -> ns),
                                    # op_ns_per_element_curve (op -> [[elements, ns], ...])
                                    # and op_ns_per_row (op -> ns)
    op_overhead_us: {Shape: 0.14}   # optional, microseconds per dispatch by operator type
                                    # (an op type not listed costs launch_overhead_us)
    sources: {memory_bandwidth_gbs: "..."}   # field -> where the number comes from

Loading validates everything: required keys, types, positive numbers, no unknown keys. Errors
are :class:`HardwareError` naming the file, the line, the key and the problem.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from graph_autofusion.cost.profile_schema import (
    KINDS,
    SCHEMA_VERSION,
    HardwareError,
    validate_profile_data,
)
from graph_autofusion.yaml_util import load_yaml_with_nodes, read_yaml_file

__all__ = [
    "HOST",
    "HardwareError",
    "HardwareProfile",
    "KINDS",
    "SCHEMA_VERSION",
    "SHIPPED_PROFILES",
    "hardware_dir",
    "host_profile_path",
    "list_profiles",
    "load_profile",
    "parse_profile_text",
    "save_profile",
    "validate_profile_data",
]


#: Names of the profiles shipped as package data, in display order.
SHIPPED_PROFILES: tuple[str, ...] = (
    "ascend910a",
    "ascend910b",
    "ascend310p",
    "a100",
    "h100",
    "h200",
    "x86_avx2",
    "x86_avx512",
    "arm_neon",
)


HOST = "host"


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


def _from_dict(data: dict[str, Any]) -> HardwareProfile:
    return HardwareProfile(
        name=data["name"],
        description=data["description"],
        kind=data["kind"],
        memory_bandwidth_gbs=float(data["memory_bandwidth_gbs"]),
        peak_gflops={str(k): float(v) for k, v in data["peak_gflops"].items()},
        launch_overhead_us=float(data["launch_overhead_us"]),
        local_memory_kb=float(data["local_memory_kb"]),
        cores=int(data["cores"]),
        vector_width_bytes=int(data["vector_width_bytes"]),
        l1_kb=None if data.get("l1_kb") is None else float(data["l1_kb"]),
        l2_kb=None if data.get("l2_kb") is None else float(data["l2_kb"]),
        extra=dict(data.get("extra") or {}),
        sources={str(k): str(v) for k, v in (data.get("sources") or {}).items()},
        op_overhead_us={str(k): float(v) for k, v in (data.get("op_overhead_us") or {}).items()},
    )


def parse_profile_text(text: str, path: str = "<string>") -> HardwareProfile:
    """Parse and validate profile YAML. Errors name ``path``, the line, the key and the problem."""
    root, data = load_yaml_with_nodes(text, path, HardwareError)
    lines: dict[str, int] = {"": 1}
    if isinstance(root, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, _value in root.value:
            key = str(key_node.value)
            if key in seen:
                raise HardwareError(
                    f"{path}, line {key_node.start_mark.line + 1}: key {key!r}: duplicate key"
                )
            seen.add(key)
            lines[key] = key_node.start_mark.line + 1
    validate_profile_data(data, path, lines)
    return _from_dict(data)


def hardware_dir() -> Path:
    """Directory of the calibrated ``host.yaml`` and of user profiles found by name.

    ``$GRAPH_AUTOFUSION_HARDWARE_DIR`` if set, else ``~/.cache/graph-autofusion/hardware``.
    """
    env = os.environ.get("GRAPH_AUTOFUSION_HARDWARE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "graph-autofusion" / "hardware"


def host_profile_path() -> Path:
    """Where the calibrated host profile is cached."""
    return hardware_dir() / f"{HOST}.yaml"


def _user_profiles() -> dict[str, Path]:
    d = hardware_dir()
    if not d.is_dir():
        return {}
    found = {}
    for p in sorted(d.glob("*.yaml")):
        if p.stem != HOST and p.stem not in SHIPPED_PROFILES:
            found[p.stem] = p
    return found


def list_profiles() -> list[str]:
    """Shipped profile names, then ``host``, then ``<name>.yaml`` files in :func:`hardware_dir`."""
    return [*SHIPPED_PROFILES, HOST, *_user_profiles()]


def _read(path: Path) -> HardwareProfile:
    text = read_yaml_file(path, HardwareError, "hardware profile")  # bounded size, UTF-8
    return parse_profile_text(text, str(path))


def _looks_like_path(s: str) -> bool:
    return os.sep in s or "/" in s or s.endswith((".yaml", ".yml"))


def load_profile(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """Load a profile by name (see :func:`list_profiles`) or from a YAML file path.

    ``host`` loads the calibrated file under :func:`hardware_dir`; if there is none, a quick
    calibration (a few seconds) runs and its result is cached there.

    Raises:
        HardwareError: unknown name (the message lists the known ones), unreadable or malformed
            file (the message names file, line, key and problem).
    """
    if isinstance(name_or_path, os.PathLike) or _looks_like_path(str(name_or_path)):
        return _read(Path(name_or_path))
    name = str(name_or_path).strip().lower()
    if name in SHIPPED_PROFILES:
        ref = resources.files("graph_autofusion.cost").joinpath("profiles", f"{name}.yaml")
        return parse_profile_text(ref.read_text(encoding="utf-8"), f"<shipped>/{name}.yaml")
    if name == HOST:
        path = host_profile_path()
        if path.is_file():
            return _read(path)
        from graph_autofusion.cost.calibrate import calibrate_host

        profile = calibrate_host(quick=True)
        try:
            save_profile(profile, path)
        except HardwareError:
            pass  # an unwritable cache directory must not stop the caller; it re-measures
        return profile
    user = _user_profiles()
    if name in user:
        return _read(user[name])
    if Path(str(name_or_path)).is_file():
        return _read(Path(name_or_path))
    raise HardwareError(
        f"unknown hardware {str(name_or_path)!r}; known: {', '.join(list_profiles())} "
        f"(or give the path of a profile YAML file)"
    )


def save_profile(profile: HardwareProfile, path: str | os.PathLike[str]) -> None:
    """Validate ``profile`` and write it as YAML atomically (temp file + ``os.replace``).

    On any failure the destination keeps its previous content and no temp file is left.
    """
    dest = Path(path)
    try:
        text = profile.to_yaml()
    except yaml.YAMLError as e:
        raise HardwareError(f"{dest}: profile cannot be written as YAML: {e}") from None
    header = f"# graph-autofusion hardware profile '{profile.name}'. Schema: docs/hardware.md\n"
    tmp: str | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(header + text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
        tmp = None
    except OSError as e:
        raise HardwareError(f"{dest}: cannot write hardware profile: {e.strerror or e}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)

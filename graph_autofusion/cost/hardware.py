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

import functools
import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from graph_autofusion import env
from graph_autofusion.cost import calibrate
from graph_autofusion.cost.measure_host import machine_fingerprint
from graph_autofusion.cost.profile import HardwareProfile
from graph_autofusion.cost.profile_schema import (
    KINDS,
    SCHEMA_VERSION,
    HardwareError,
    validate_profile_data,
)
from graph_autofusion.files import temp_beside
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


@functools.lru_cache(maxsize=16)
def parse_profile_text(text: str, path: str = "<string>") -> HardwareProfile:
    """Parse and validate profile YAML. Errors name ``path``, the line, the key and the problem.

    Cached by text and path (a profile is immutable; parsing and validating the host's ~11 KB
    file took ~0.16 s, and the PyTorch route loads it for every graph it compiles): a changed
    file is parsed again, an invalid one raises again."""
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
    given = env.hardware_dir()
    if given:
        return Path(given).expanduser()
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
            cached = _read(path)
            if not _measured_elsewhere(cached):
                return cached
        profile = calibrate.calibrate_host(quick=True)
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


def _measured_elsewhere(profile: HardwareProfile) -> bool:
    """Whether a cached host profile was calibrated under another machine fingerprint
    (:func:`~graph_autofusion.cost.measure_host.machine_fingerprint`: the CPU model, its ISA,
    the CPUs this process may use, onnxruntime's version), or before calibrations recorded
    one: its rates then describe another machine, and the host is measured again. A profile
    without ``extra.calibrated_at`` was written by hand and is kept."""
    extra = profile.extra or {}
    if "calibrated_at" not in extra:
        return False
    return extra.get("fingerprint") != machine_fingerprint()


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
        fd, tmp = temp_beside(dest, prefix=f".{dest.name}.", suffix=".tmp")
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

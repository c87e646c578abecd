"""This machine's facts and its NumPy measurements for the host profile: cores, caches,
vector width, CPU model, streaming bandwidth, matmul peak."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

_MIB = 1 << 20


def best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (page faults, thread pools)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def core_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def measure_bandwidth(quick: bool = True) -> tuple[float, str]:
    """Best streaming main-memory bandwidth in GB/s and a sentence on how it was measured."""
    mib = 128 if quick else 256
    repeats = 4 if quick else 10
    n = mib * _MIB // 4
    b = np.ones(n, dtype=np.float32)
    c = np.full(n, 2.0, dtype=np.float32)
    a = np.empty_like(b)
    a.fill(0.0)
    results: dict[str, float] = {}
    t = best_time(lambda: np.copyto(a, b), repeats)
    results["numpy copy (1 thread, 2 arrays counted)"] = 2 * a.nbytes / t / 1e9
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(core_count())
            t = best_time(lambda: torch.add(tb, tc, alpha=3.0, out=ta), repeats)
        finally:
            torch.set_num_threads(threads)
        results[f"torch triad a=b+s*c ({core_count()} threads, 1 pass, 3 arrays counted)"] = (
            3 * a.nbytes / t / 1e9
        )
    else:
        t = best_time(lambda: np.add(b, c, out=a), repeats)
        results["numpy add a=b+c (1 thread, 3 arrays counted)"] = 3 * a.nbytes / t / 1e9
    how, best = max(results.items(), key=lambda kv: kv[1])
    others = "; ".join(f"{k} {v:.1f} GB/s" for k, v in results.items() if k != how)
    l3 = read_caches()[0].get("l3")
    l3_note = f"OS-reported L3 {l3 / 1024:g} MiB" if l3 else "no L3 reported"
    return best, (
        f"measured: best of {repeats} passes of {how} on {mib} MiB float32 arrays "
        f"({l3_note}); also {others}"
    )


def measure_matmul(quick: bool = True, f32: bool = True) -> tuple[dict[str, float], dict[str, str]]:
    """Best matmul GFLOP/s per dtype (NumPy / PyTorch) and how each was measured.

    With ``f32=False`` only the other dtypes (``bf16``, full mode) are measured: the fp32 peak
    then comes from :func:`measure_ort_peak`.
    """
    sizes = (512, 1024, 1536) if quick else (1024, 2048, 4096)
    repeats = 3 if quick else 5
    peaks: dict[str, float] = {}
    how: dict[str, str] = {}
    best, where = 0.0, ""
    rng = np.random.default_rng(0)
    for n in sizes if f32 else ():
        x = rng.standard_normal((n, n), dtype=np.float32)
        y = rng.standard_normal((n, n), dtype=np.float32)
        gf = 2 * n**3 / best_time(lambda x=x, y=y: x @ y, repeats) / 1e9
        if gf > best:
            best, where = gf, f"numpy float32 {n}x{n}"
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        threads = torch.get_num_threads()
        torch.set_num_threads(core_count())
        try:
            for n in sizes if f32 else ():
                x = torch.randn(n, n)
                y = torch.randn(n, n)
                gf = 2 * n**3 / best_time(lambda x=x, y=y: torch.mm(x, y), repeats) / 1e9
                if gf > best:
                    best, where = gf, f"torch float32 {n}x{n} ({core_count()} threads)"
            if not quick and "bf16" in _cpu_flags_text():
                n = sizes[-1]
                x = torch.randn(n, n, dtype=torch.bfloat16)
                y = torch.randn(n, n, dtype=torch.bfloat16)
                t = best_time(lambda: torch.mm(x, y), repeats)
                peaks["bf16"] = round(2 * n**3 / t / 1e9, 1)
                how["peak_gflops.bf16"] = (
                    f"measured: best of {repeats} torch bfloat16 {n}x{n} matmuls, 2*n^3 flops"
                )
        finally:
            torch.set_num_threads(threads)
    if not f32:
        return peaks, how
    peaks = {"f32": round(best, 1), **peaks}
    how["peak_gflops.f32"] = (
        f"measured: best of {repeats} square matmuls at sizes {', '.join(map(str, sizes))} "
        f"(numpy{' and torch' if torch is not None else ''}); best was {where}, 2*n^3 flops"
    )
    return peaks, how


def _cpu_flags_text() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.lower().startswith(("flags", "features")):
            return line.split(":", 1)[-1]
    return ""


def vector_width_bytes() -> tuple[int, str]:
    """SIMD width from /proc/cpuinfo flags: avx512f 64, avx2 32, otherwise 16 (SSE/NEON)."""
    flags = set(_cpu_flags_text().split())
    if "avx512f" in flags:
        return 64, "/proc/cpuinfo flag avx512f (512-bit zmm registers)"
    if "avx2" in flags:
        return 32, "/proc/cpuinfo flag avx2 (256-bit ymm registers)"
    what = "asimd (NEON)" if "asimd" in flags else "none of avx512f/avx2"
    return 16, f"/proc/cpuinfo flags: {what}; 128-bit vectors assumed"


def _parse_size_kb(text: str) -> float | None:
    text = text.strip().upper()
    mult = {"K": 1, "M": 1024, "G": 1024 * 1024}
    try:
        if text and text[-1] in mult:
            return float(text[:-1]) * mult[text[-1]]
        return float(text) / 1024
    except ValueError:
        return None


def read_caches() -> tuple[dict[str, float], str]:
    """Cache sizes in KiB per core (``l1d``, ``l2``) and total (``l3``) as the OS reports them."""
    found: dict[str, float] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.is_dir() else ():
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = _parse_size_kb((idx / "size").read_text())
        except OSError:
            continue
        if size is None or kind == "Instruction":
            continue
        found[{"1": "l1d", "2": "l2", "3": "l3"}.get(level, f"l{level}")] = size
    if found:
        return found, f"{base}/index*/size"
    names = {
        "l1d": "SC_LEVEL1_DCACHE_SIZE",
        "l2": "SC_LEVEL2_CACHE_SIZE",
        "l3": "SC_LEVEL3_CACHE_SIZE",
    }
    for key, name in names.items():
        try:
            value = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if value and value > 0:
            found[key] = value / 1024
    return found, "os.sysconf(SC_LEVEL*_CACHE_SIZE)"


def cpu_model_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[-1].strip()
    return ""


#: CPU features that change which kernels onnxruntime, MLAS and our generated code run.
FINGERPRINT_ISA = (
    "avx2 fma avx_vnni avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16".split()
)


def machine_fingerprint() -> str:
    """What a calibration is valid for: the CPU model, the ISA extensions of
    :data:`FINGERPRINT_ISA` it has, the CPUs this process may use and onnxruntime's version. A
    cached host profile measured under another fingerprint (the disk moved to another CPU,
    onnxruntime upgraded) is measured again."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    flags: set[str] = set()
    for line in text.splitlines():
        if line.lower().startswith("flags"):
            flags = set(line.split(":", 1)[-1].split())
            break
    try:
        import onnxruntime

        ort = f"onnxruntime {onnxruntime.__version__}"
    except ImportError:
        ort = "no onnxruntime"
    isa = " ".join(f for f in FINGERPRINT_ISA if f in flags) or "none of the listed ISA"
    return f"{cpu_model_name() or 'unknown CPU'}; {isa}; {core_count()} CPUs; {ort}"

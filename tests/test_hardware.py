"""Hardware profiles: shipped files, validation errors, save/load, calibration, CLI."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml

from graph_autofusion.cost.calibrate import calibrate_host, read_caches, vector_width_bytes
from graph_autofusion.cost.hardware import (
    SHIPPED_PROFILES,
    HardwareError,
    HardwareProfile,
    list_profiles,
    load_profile,
    save_profile,
)
from graph_autofusion.cost.hardware_cli import add_hardware_commands
from graph_autofusion.errors import GraphAutoFusionError

EXPECTED = {
    "ascend910a",
    "ascend910b",
    "ascend310p",
    "a100",
    "h100",
    "h200",
    "x86_avx2",
    "x86_avx512",
    "arm_neon",
}


@pytest.fixture(autouse=True)
def hw_dir(tmp_path, monkeypatch):
    """Every test gets its own hardware directory (no stray ~/.cache/... state)."""
    d = tmp_path / "hw"
    monkeypatch.setenv("GRAPH_AUTOFUSION_HARDWARE_DIR", str(d))
    return d


def _valid() -> dict:
    return yaml.safe_load(
        (Path(__file__).parents[1] / "graph_autofusion/cost/profiles/x86_avx2.yaml").read_text()
    )


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


# ---------------------------------------------------------------- shipped profiles


def test_list_contains_shipped_and_host():
    names = list_profiles()
    assert set(SHIPPED_PROFILES) == EXPECTED
    assert EXPECTED <= set(names) and "host" in names


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_profile_loads_with_sources(name):
    p = load_profile(name)
    assert p.name == name
    assert p.kind in ("npu", "gpu", "cpu")
    assert p.sources.get("memory_bandwidth_gbs")
    assert any(k.startswith("peak_gflops") for k in p.sources)
    assert p.bandwidth_bytes_per_s() == p.memory_bandwidth_gbs * 1e9
    assert p.peak_flops_per_s("f32") > 0
    assert p.launch_overhead_s() == pytest.approx(p.launch_overhead_us * 1e-6)
    assert p.local_memory_bytes() == round(p.local_memory_kb * 1024)
    # every sources key names a real field
    fields = set(p.to_dict())
    assert all(k.split(".")[0] in fields for k in p.sources)


@pytest.mark.parametrize(
    "name, ub_kb, l1_kb, l0c_kb",
    [("ascend910a", 256, 1024, 256), ("ascend910b", 192, 512, 128), ("ascend310p", 256, 1024, 256)],
)
def test_ascend_on_chip_sizes(name, ub_kb, l1_kb, l0c_kb):
    p = load_profile(name)
    assert p.local_memory_kb == ub_kb
    assert p.local_memory_bytes() == ub_kb * 1024
    assert p.l1_kb == l1_kb
    assert p.extra["l0_a_kb"] == 64 and p.extra["l0_b_kb"] == 64
    assert p.extra["l0_c_kb"] == l0c_kb
    assert "ub_size" in p.sources["local_memory_kb"]


def test_relations_between_profiles():
    a100, h100, h200 = (load_profile(n) for n in ("a100", "h100", "h200"))
    assert a100.bandwidth_bytes_per_s() < h100.bandwidth_bytes_per_s()
    assert h100.bandwidth_bytes_per_s() < h200.bandwidth_bytes_per_s()
    assert h100.peak_flops_per_s("bf16") == h200.peak_flops_per_s("bf16")
    assert load_profile("x86_avx512").vector_width_bytes == 64
    assert load_profile("x86_avx2").vector_width_bytes == 32
    assert load_profile("arm_neon").vector_width_bytes == 16


def test_dtype_lookup_and_fallback():
    p = load_profile("a100")
    assert p.peak_flops_per_s("f16") == 312000e9
    assert p.peak_flops_per_s("float16") == 312000e9
    assert p.peak_flops_per_s("bfloat16") == 312000e9
    x = load_profile("x86_avx2")
    assert "f16" not in x.peak_gflops
    assert x.peak_flops_per_s("f16") == x.peak_flops_per_s("f32")  # falls back to f32

    class FakeDType:
        short = "i8"

    assert p.peak_flops_per_s(FakeDType()) == 624000e9


# ---------------------------------------------------------------- user files and errors


def test_user_file_loads_from_path(tmp_path):
    data = _valid()
    data["name"] = "my_box"
    data["memory_bandwidth_gbs"] = 77.5
    path = _write(tmp_path / "my_box.yaml", data)
    p = load_profile(path)
    assert p.name == "my_box" and p.memory_bandwidth_gbs == 77.5
    assert load_profile(str(path)) == p


def test_user_file_found_by_name_in_hardware_dir(hw_dir):
    hw_dir.mkdir()
    data = _valid()
    data["name"] = "lab_server"
    _write(hw_dir / "lab_server.yaml", data)
    assert "lab_server" in list_profiles()
    assert load_profile("lab_server").name == "lab_server"


@pytest.mark.parametrize(
    "mutate, key, problem",
    [
        (lambda d: d.pop("memory_bandwidth_gbs"), "memory_bandwidth_gbs", "missing"),
        (lambda d: d.update(cores="eight"), "cores", "must be an integer"),
        (lambda d: d.update(cores=8.5), "cores", "must be an integer"),
        (lambda d: d.update(launch_overhead_us=-1.0), "launch_overhead_us", "positive"),
        (lambda d: d.update(local_memory_kb=0), "local_memory_kb", "positive"),
        (lambda d: d.update(bandwith_gbs=10), "bandwith_gbs", "unknown key"),
        (lambda d: d.update(kind="tpu"), "kind", "must be one of"),
        (lambda d: d.update(peak_gflops={"f16": 10}), "peak_gflops", "'f32'"),
        (lambda d: d.update(peak_gflops={"f32": -3}), "peak_gflops", "positive"),
        (lambda d: d["sources"].update(bandwidth="x"), "sources", "names no profile key"),
        (lambda d: d.update(extra={"l3": [1, 2]}), "extra", "numbers, strings"),
        (lambda d: d.update(op_overhead_us=[0.2]), "op_overhead_us", "must be a mapping"),
        (lambda d: d.update(op_overhead_us={"Shape": 0}), "op_overhead_us", "positive"),
        (lambda d: d.update(op_overhead_us={"Slice": "fast"}), "op_overhead_us", "positive"),
        (lambda d: d.update(op_overhead_us={"": 0.3}), "op_overhead_us", "operator type"),
        (lambda d: d.update(extra={"op_ns_per_element": {"Sin": -1}}), "extra", "positive ns"),
        (lambda d: d.update(extra={"op_ns_per_element": [1.0]}), "extra", "positive ns"),
        (
            lambda d: d.update(
                extra={"op_ns_per_element_curve": {"Sin": [[4096, 1.0], [2048, 1]]}}
            ),
            "extra",
            "elements increasing",
        ),
        (
            lambda d: d.update(extra={"op_ns_per_element_curve": {"Sin": [[2048, 0]]}}),
            "extra",
            "op_ns_per_element_curve",
        ),
        (lambda d: d.update(extra={"op_ns_per_row": {"Softmax": -2}}), "extra", "ns >= 0"),
        (
            lambda d: d.update(extra={"op_ns_per_element_curve": {"Sin": 1.0}}),
            "extra",
            "[elements, ns per element] pairs",
        ),
    ],
)
def test_malformed_profile_names_file_key_and_problem(tmp_path, mutate, key, problem):
    data = _valid()
    mutate(data)
    path = _write(tmp_path / "bad.yaml", data)
    with pytest.raises(HardwareError) as e:
        load_profile(path)
    msg = str(e.value)
    assert str(path) in msg and repr(key) in msg and problem in msg
    assert "line " in msg


def test_error_points_at_the_line_of_the_key(tmp_path):
    path = tmp_path / "x.yaml"
    src = (Path(__file__).parents[1] / "graph_autofusion/cost/profiles/a100.yaml").read_text()
    lines = src.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("cores:"))
    lines[i] = "cores: -4"
    path.write_text("\n".join(lines))
    with pytest.raises(HardwareError, match=rf"line {i + 1}: key 'cores': must be positive"):
        load_profile(path)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "must be a YAML mapping"),
        ("name: a\nname: b\n", "duplicate key"),
        ("", "must be a YAML mapping"),
    ],
)
def test_bad_yaml_names_file(tmp_path, text, problem):
    path = _write(tmp_path / "broken.yaml", text)
    with pytest.raises(HardwareError, match=problem) as e:
        load_profile(path)
    assert str(path) in str(e.value)


def test_missing_file_is_a_hardware_error(tmp_path):
    with pytest.raises(HardwareError, match="cannot read"):
        load_profile(tmp_path / "nope.yaml")


def test_unknown_name_lists_known():
    with pytest.raises(HardwareError) as e:
        load_profile("tpu_v5")
    msg = str(e.value)
    assert "tpu_v5" in msg
    assert all(n in msg for n in EXPECTED) and "host" in msg
    assert isinstance(e.value, GraphAutoFusionError)


# ---------------------------------------------------------------- save / load


def test_save_load_round_trip(tmp_path):
    p = load_profile("ascend910b")
    out = tmp_path / "sub" / "copy.yaml"
    save_profile(p, out)
    assert load_profile(out) == p
    assert [f.name for f in out.parent.iterdir()] == ["copy.yaml"]


def test_save_is_atomic_on_failure(tmp_path):
    good = load_profile("h100")
    out = tmp_path / "profile.yaml"
    save_profile(good, out)
    before = out.read_bytes()
    bad = HardwareProfile(**{**good.__dict__, "cores": -1})
    with pytest.raises(HardwareError, match="cores"):
        save_profile(bad, out)
    weird = HardwareProfile(**{**good.__dict__, "extra": {"obj": object()}})
    with pytest.raises(HardwareError):
        save_profile(weird, out)
    assert out.read_bytes() == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["profile.yaml"]
    fresh = tmp_path / "never.yaml"
    with pytest.raises(HardwareError):
        save_profile(bad, fresh)
    assert not fresh.exists()


def test_save_to_unwritable_place_is_a_hardware_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(HardwareError, match="cannot write"):
        save_profile(load_profile("a100"), blocker / "p.yaml")


def test_shipped_profiles_have_no_op_table_and_fall_back_to_launch_overhead():
    for name in SHIPPED_PROFILES:
        p = load_profile(name)
        assert p.op_overhead_us == {}
        assert p.op_overhead_s("Slice") == p.launch_overhead_s()
        assert "op_overhead_us" not in p.to_dict()


def test_op_overhead_table_round_trips_and_is_used_per_type(tmp_path):
    data = _valid()
    data["op_overhead_us"] = {"Shape": 0.14, "Where": 0.61}
    data["sources"]["op_overhead_us"] = "measured: test"
    p = load_profile(_write(tmp_path / "ops.yaml", data))
    assert p.op_overhead_us == {"Shape": 0.14, "Where": 0.61}
    assert p.op_overhead_s("Where") == pytest.approx(0.61e-6)
    assert p.op_overhead_s("Shape") == pytest.approx(0.14e-6)
    # an operator type not in the table, or none, costs the generic launch overhead
    assert p.op_overhead_s("Gemm") == p.launch_overhead_s()
    assert p.op_overhead_s() == p.launch_overhead_s()
    save_profile(p, tmp_path / "again.yaml")
    again = load_profile(tmp_path / "again.yaml")
    assert again == p
    assert "  op overhead (us)    Shape 0.14, Where 0.61" in again.summary_lines()


def test_calibrated_rate_tables_round_trip_and_show_compactly(tmp_path):
    """The host calibration's nested entries (per-element curve, per-row costs) save and load
    unchanged, tuples included, and `hardware show` summarises the curve on one line."""
    data = _valid()
    data["extra"] = {
        "op_ns_per_element": {"Sigmoid": 0.13},
        "op_ns_per_element_curve": {"Sigmoid": [[2048, 0.23], [65536, 0.13]]},
        "op_ns_per_row": {"Softmax": 8.1},
    }
    p = load_profile(_write(tmp_path / "rates.yaml", data))
    save_profile(p, tmp_path / "again.yaml")
    assert load_profile(tmp_path / "again.yaml") == p

    tup = dataclasses.replace(
        p, extra={**p.extra, "op_ns_per_element_curve": {"Sigmoid": ((2048, 0.23), (65536, 0.13))}}
    )
    save_profile(tup, tmp_path / "tuples.yaml")
    assert load_profile(tmp_path / "tuples.yaml") == p
    lines = "\n".join(p.summary_lines())
    assert "extra.op_ns_per_element_curve 1 operators at 2048, 65536 elements" in lines
    assert "[[2048" not in lines


def test_host_uses_cached_file(hw_dir):
    hw_dir.mkdir()
    data = _valid()
    data["name"] = "host"
    data["memory_bandwidth_gbs"] = 12.25
    _write(hw_dir / "host.yaml", data)
    p = load_profile("host")
    assert p.name == "host" and p.memory_bandwidth_gbs == 12.25


@pytest.mark.parametrize(
    ("extra", "measured_again"),
    [
        ({}, False),  # written by hand: kept
        ({"calibrated_at": "2026-12-04T16:39:20+0000"}, True),  # before fingerprints
        ({"calibrated_at": "2026-12-04T16:39:20+0000", "fingerprint": "Xeon; avx2"}, True),
        ({"calibrated_at": "2026-12-04T16:39:20+0000", "fingerprint": None}, False),
    ],
)
def test_a_host_profile_calibrated_on_another_machine_is_measured_again(
    hw_dir, monkeypatch, extra, measured_again
):
    """The cached host profile describes the machine it was calibrated on: one measured
    under another fingerprint (CPU model, ISA, CPUs, onnxruntime), or before calibrations
    recorded one, is calibrated again and replaced; a hand-written one is kept."""
    from graph_autofusion.cost import calibrate
    from graph_autofusion.cost.measure_host import machine_fingerprint

    here = machine_fingerprint()
    assert "CPUs; onnxruntime" in here
    if extra.get("fingerprint", "") is None:
        extra = {**extra, "fingerprint": here}
    hw_dir.mkdir()
    data = _valid()
    data["name"] = "host"
    data["memory_bandwidth_gbs"] = 12.25
    data["extra"] = extra
    _write(hw_dir / "host.yaml", data)
    fresh = dataclasses.replace(
        load_profile(hw_dir / "host.yaml"),
        memory_bandwidth_gbs=31.5,
        extra={"calibrated_at": "2026-12-05T05:00:00+0000", "fingerprint": here},
    )
    calls = []
    monkeypatch.setattr(calibrate, "calibrate_host", lambda quick: calls.append(quick) or fresh)
    p = load_profile("host")
    assert p.memory_bandwidth_gbs == (31.5 if measured_again else 12.25)
    assert bool(calls) is measured_again
    # the replacement is cached: the next load reads it and measures nothing
    assert load_profile("host").memory_bandwidth_gbs == p.memory_bandwidth_gbs
    assert len(calls) == int(measured_again)


# ---------------------------------------------------------------- calibration


def test_os_facts():
    caches, how = read_caches()
    width, _ = vector_width_bytes()
    assert width in (16, 32, 64)
    if caches:
        assert all(v > 0 for v in caches.values()) and how


@pytest.mark.slow
def test_quick_calibration_is_sane_and_cached(hw_dir):
    p = calibrate_host(quick=True)
    assert p.name == "host" and p.kind == "cpu"
    assert 1 <= p.memory_bandwidth_gbs <= 1000
    assert p.peak_gflops["f32"] > 1
    # ORT's per-node cost for tiny ops is ~0.2 us here; only an absurd value fails
    assert 0.01 <= p.launch_overhead_us <= 1000
    assert p.cores >= 1 and p.local_memory_kb > 0
    for key in ("memory_bandwidth_gbs", "peak_gflops.f32", "launch_overhead_us"):
        assert p.sources[key].startswith("measured")
    # onnxruntime is installed: the fp32 peak is its own MatMul's, and every operator type of
    # the dispatch table was measured (positive, sub-100-us on any sane machine)
    assert "onnxruntime" in p.sources["peak_gflops.f32"]
    assert 0 < p.extra["peak_cpu_share"] <= p.cores + 0.5
    table = p.op_overhead_us
    assert {"Shape", "Gather", "Concat", "Slice", "Where", "Transpose", "MatMul"} <= set(table)
    assert all(0 < v < 100 for v in table.values())
    assert p.sources["op_overhead_us"].startswith("measured")
    # the fused operators the native rewrites emit are measured like their pieces
    rates = p.extra["op_ns_per_element"]
    from graph_autofusion.cost.calibrate import NATIVE_OPS

    assert set(NATIVE_OPS) <= set(rates) and all(rates[op] > 0 for op in NATIVE_OPS)
    # ... at every size of the curve, the largest being the flat rate
    from graph_autofusion.cost.calibrate import THROUGHPUT_ROWS

    curve = p.extra["op_ns_per_element_curve"]
    assert set(curve) == set(rates)
    for op, points in curve.items():
        # elements as the cost model counts them: Slice's and Split's first output is half
        half = 2 if op in ("Slice", "Split") else 1
        assert [n for n, _ in points] == [r * 1024 // half for r in THROUGHPUT_ROWS]
        assert all(ns > 0 for _, ns in points) and points[-1][1] == rates[op]
    # and the row-wise ones' cost per row beyond the curve
    from graph_autofusion.cost.calibrate import ROW_OPS

    per_row = p.extra["op_ns_per_row"]
    assert set(per_row) == set(ROW_OPS) & set(rates) and all(v >= 0 for v in per_row.values())
    assert 0 < p.extra["contraction_half_time_us"] < 100
    assert 0 <= p.extra["compute_memory_overlap"] <= 1
    for key in ("extra.contraction_half_time_us", "extra.compute_memory_overlap"):
        assert p.sources[key].startswith("measured")
    save_profile(p, hw_dir / "host.yaml")
    assert load_profile("host") == p
    assert load_profile(hw_dir / "host.yaml") == p


# ---------------------------------------------------------------- CLI


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="graph-autofusion")
    sub = parser.add_subparsers(dest="command", required=True)
    add_hardware_commands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_list(capsys, hw_dir):
    assert _run(["hardware", "list"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in EXPECTED)
    assert "not calibrated yet" in out and str(hw_dir) in out
    assert _run(["hardware", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["a100"]["memory_bandwidth_gbs"] == 2039
    assert by_name["host"]["calibrated"] is False


def test_cli_show(capsys, tmp_path):
    assert _run(["hardware", "show", "ascend910b"]) == 0
    out = capsys.readouterr().out
    assert "192 KiB" in out and "ub_size" in out
    assert _run(["hardware", "show", "h200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_bandwidth_gbs"] == 4800
    with pytest.raises(HardwareError, match="known: "):
        _run(["hardware", "show", "nonexistent"])


@pytest.mark.slow
def test_cli_calibrate_writes_file(capsys, tmp_path):
    out = tmp_path / "mine.yaml"
    assert _run(["hardware", "calibrate", "--quick", "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    p = load_profile(out)
    assert p.name == "host" and p.memory_bandwidth_gbs > 0
    assert not any(f.name.endswith(".tmp") for f in tmp_path.iterdir())


def test_env_dir_is_used(hw_dir):
    assert os.environ["GRAPH_AUTOFUSION_HARDWARE_DIR"] == str(hw_dir)
    from graph_autofusion.cost.hardware import host_profile_path

    assert host_profile_path() == hw_dir / "host.yaml"


def test_full_calibration_keeps_the_median_of_three_bandwidth_samples(monkeypatch):
    """The full calibration samples the bandwidth three times over its run and keeps the
    median: one sample in a transient fast window (this machine's triad sometimes runs at
    ~80 GB/s for ~12 s against its usual ~47) does not become the profile's bandwidth, and the
    overlap measurement uses the kept value. The quick one keeps its single sample."""
    from graph_autofusion.cost import calibrate

    samples = iter([81.0, 47.0, 46.0])
    seen = {}
    monkeypatch.setattr(calibrate, "measure_bandwidth", lambda q: (next(samples), "measured: x"))
    monkeypatch.setattr(calibrate, "measure_ort_peak", lambda q: (400.0, "measured: p", 2.0))
    monkeypatch.setattr(calibrate, "measure_matmul", lambda q, f32=True: ({}, {}))
    monkeypatch.setattr(calibrate, "measure_dispatch_overhead", lambda q: (0.2, "measured: d"))
    monkeypatch.setattr(calibrate, "measure_op_overheads", lambda q: None)
    monkeypatch.setattr(calibrate, "measure_contraction_knee", lambda q: None)
    monkeypatch.setattr(calibrate, "measure_op_throughput", lambda q: None)

    def overlap(peak, bandwidth, knee, q):
        seen["bandwidth"] = bandwidth
        return None

    monkeypatch.setattr(calibrate, "measure_gemm_overlap", overlap)
    p = calibrate.calibrate_host(quick=False)
    assert p.memory_bandwidth_gbs == 47.0 and seen["bandwidth"] == 47.0
    assert "median of 3" in p.sources["memory_bandwidth_gbs"]
    assert "81.0, 47.0, 46.0 GB/s" in p.sources["memory_bandwidth_gbs"]
    samples = iter([81.0])
    q = calibrate.calibrate_host(quick=True)
    assert q.memory_bandwidth_gbs == 81.0 and "median" not in q.sources["memory_bandwidth_gbs"]


def test_calibrate_warns_when_a_number_jumps_from_the_profile_it_replaces(
    monkeypatch, capsys, tmp_path
):
    """Recalibrating into a transient machine state (bandwidth 1.7x the last calibration's)
    says so, naming the number, both values and when the replaced profile was made; ordinary
    drift, or no previous profile, says nothing."""

    from graph_autofusion.cost import calibrate
    from graph_autofusion.cost.hardware_cli import drift_warnings

    data = _valid()
    data["name"] = "host"
    data["extra"] = {"calibrated_at": "2026-11-29T16:00:00+0000"}
    out = _write(tmp_path / "host.yaml", data)
    before = load_profile(out)
    fast = dataclasses.replace(before, memory_bandwidth_gbs=before.memory_bandwidth_gbs * 1.7)
    monkeypatch.setattr(calibrate, "calibrate_host", lambda quick: fast)
    assert _run(["hardware", "calibrate", "--quick", "-o", str(out)]) == 0
    text = capsys.readouterr().err
    assert "warning: memory bandwidth" in text and "1.70x" in text
    assert "2026-11-29T16:00:00+0000" in text
    assert load_profile(out).memory_bandwidth_gbs == fast.memory_bandwidth_gbs
    near = dataclasses.replace(before, memory_bandwidth_gbs=before.memory_bandwidth_gbs * 1.1)
    assert drift_warnings(before, near) == []
    assert drift_warnings(None, fast) == []
    # another profile's file is not a previous calibration of this one
    assert drift_warnings(dataclasses.replace(before, name="other"), fast) == []
    # an unreadable previous file: no warning, the new profile is written
    out.write_text("not: [valid")
    assert _run(["hardware", "calibrate", "--quick", "-o", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert load_profile(out).memory_bandwidth_gbs == fast.memory_bandwidth_gbs

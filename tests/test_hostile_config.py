"""Hostile rule files, hardware profiles, paths and output folders (issue 15): each is one clear
error naming the file (and the line or field), in bounded time and memory, and nothing is
written; paths with spaces and non-ASCII characters work end to end."""

from __future__ import annotations

import errno
import os
import stat

import numpy as np
import pytest
import yaml

from graph_autofusion.cli import main
from graph_autofusion.cost.hardware import HardwareError, load_profile, parse_profile_text
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.patterns.yaml_rules import RuleFileError, load_rule_file, load_rule_text
from graph_autofusion.yaml_util import MAX_DEPTH, MAX_YAML_BYTES
from tests.tiny_models import FAST, run, write_model

# ------------------------------------------------------------------ rule YAML

ENTRY = "  - name: r\n    fused_op: F\n    pattern: 'Relu(x)'\n"
RULE = "rules:\n" + ENTRY  # one good rule; the cases below add a key to it


def _laughs(levels: int = 9) -> str:
    """The "billion laughs" document: 10**levels values from a few hundred bytes."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


HOSTILE_RULES = {
    "billion-laughs": (
        _laughs() + "rules:\n  - name: r\n    fused_op: F\n    pattern: *a9\n",
        "aliases",
    ),
    "laughs-in-a-list": (_laughs() + "rules: *a9\n", "aliases"),
    "deep-sequence": ("rules: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested more than"),
    "deep-mapping": ("rules: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n", "nested more than"),
    "recursive-alias": ("rules: &r [*r]\n", "recursive"),
    "python-object-tag": (
        "rules:\n  - !!python/object/apply:os.system ['touch PWNED']\n",
        "python/object/apply:os.system",
    ),
    "python-name-tag": (
        "rules:\n  - name: !!python/name:os.system\n    fused_op: F\n    pattern: Relu(x)\n",
        "python/name",
    ),
    "pattern-calls-import": (
        "rules:\n  - name: r\n    fused_op: F\n    pattern: \"__import__('os').system('touch "
        "PWNED')\"\n",
        "is not an operator name",
    ),
    "attribute-calls-code": (
        "rules:\n  - name: r\n    fused_op: F\n    pattern: \"Relu(x, alpha=__import__('os')."
        "system('touch PWNED'))\"\n",
        "expected a literal value",
    ),
    "check-calls-code": (
        RULE + "    checks: [\"__import__('os').system('touch PWNED')\"]\n",
        "unknown constraint",
    ),
    "lambda": ("rules:\n  - name: r\n    fused_op: F\n    pattern: '(lambda: 1)()'\n", "operator"),
    "power-bomb": (
        "rules:\n  - name: r\n    fused_op: F\n    pattern: 'Relu(x, alpha=9**9**9)'\n",
        "expected a literal value",
    ),
    "deep-pattern": (
        "rules:\n  - name: r\n    fused_op: F\n    pattern: '"
        + "Relu(" * 5000
        + "x"
        + ")" * 5000
        + "'\n",
        "longer than",
    ),
    "name-is-a-list": ("rules:\n  - name: [1, 2]\n    fused_op: F\n    pattern: Relu(x)\n", "name"),
    "pattern-is-a-mapping": (
        "rules:\n  - name: r\n    fused_op: F\n    pattern: {a: 1}\n",
        "pattern must be a non-empty string",
    ),
    "priority-is-a-bool": (RULE + "    priority: true\n", "priority has the wrong type"),
    "tolerance-is-nan": (RULE + "    tolerance: .nan\n", "tolerance"),
    "tolerance-above-one": (RULE + "    tolerance: 2\n", "(0, 1]"),
    "threshold-negative": (RULE + "    benefit_threshold: -0.5\n", "[0, 1)"),
    "presets-not-strings": (RULE + "    presets: [1, {a: b}]\n", "list of strings"),
    "integer-key": (RULE + "    7: seven\n", "unknown key"),
    "rank-is-a-string": (
        "rules:\n  - name: r\n    fused_op: F\n    pattern: \"Relu(var(x, rank='four'))\"\n",
        "integer >= 0",
    ),
    "unknown-dtype": (
        "rules:\n  - name: r\n    fused_op: F\n    pattern: \"Relu(var(x, dtypes=['f99']))\"\n",
        "unknown dtype 'f99'",
    ),
    "check-of-unbound-variable": (RULE + "    checks: ['broadcastable(x, y)']\n", "%y"),
    "horizontal-unbound": (RULE + "    horizontal: z\n", "%z"),
    "rules-not-a-list": ("rules: 5\n", "'rules' list"),
    "not-a-mapping": ("- 1\n- 2\n", "'rules' list"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RULES))
def test_hostile_rule_file_is_one_clear_error(case, tmp_path, monkeypatch):
    text, words = HOSTILE_RULES[case]
    monkeypatch.chdir(tmp_path)  # a "touch PWNED" that ran would land here
    path = tmp_path / f"{case}.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RuleFileError) as info:
        load_rule_file(path)
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    assert words in msg, msg
    assert len(msg) < 600  # a huge value is clipped, never printed whole
    assert not (tmp_path / "PWNED").exists()  # nothing was executed


def test_rule_file_errors_name_the_line():
    text = RULE + "  - name: s\n    fused_op: G\n    pattern: 'Relu(x'\n"
    with pytest.raises(RuleFileError, match=r"^rules\.yaml, line 5: rule 's': pattern: syntax"):
        load_rule_text(text, "rules.yaml")
    with pytest.raises(RuleFileError, match=r"^t\.yaml, line 3: not valid YAML: .*python/obj"):
        load_rule_text("rules:\n  - a\n  - !!python/object:os.Foo {}\n", "t.yaml")


def test_the_depth_bound_leaves_real_nesting_alone():
    nested = "rules: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    with pytest.raises(RuleFileError, match="each rule must be a mapping"):
        load_rule_text(nested, "ok-depth.yaml")  # parsed: refused by the schema, not the bound


def test_huge_rule_file_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.write(RULE.encode())
        f.truncate(MAX_YAML_BYTES + 1024)  # sparse: no 8 MiB written to the disk
    with pytest.raises(RuleFileError, match=r"huge\.yaml: rule file is larger than 8 MiB"):
        load_rule_file(path)


def test_rule_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"rules:\n  - name: caf\xe9\n")
    with pytest.raises(RuleFileError, match=r"latin1\.yaml, line 2: rule file is not UTF-8"):
        load_rule_file(path)


# ------------------------------------------------------------------ hardware profiles


def _profile(**changes) -> str:
    data = yaml.safe_load(load_profile("a100").to_yaml())
    for key, value in changes.items():
        if value is KeyError:
            data.pop(key)
        else:
            data[key] = value
    return yaml.safe_dump(data, sort_keys=False)


HOSTILE_PROFILES = {
    "negative-bandwidth": (_profile(memory_bandwidth_gbs=-5), "memory_bandwidth_gbs", "positive"),
    "zero-launch": (_profile(launch_overhead_us=0), "launch_overhead_us", "positive"),
    "nan-bandwidth": (
        _profile(memory_bandwidth_gbs=float("nan")),
        "memory_bandwidth_gbs",
        "finite number",
    ),
    "infinite-local-memory": (_profile(local_memory_kb=float("inf")), "local_memory_kb", "finite"),
    "nan-peak": (_profile(peak_gflops={"f32": float("nan")}), "peak_gflops", "positive number"),
    "negative-peak": (_profile(peak_gflops={"f32": -1.0}), "peak_gflops", "positive number"),
    "zero-cores": (_profile(cores=0), "cores", "positive"),
    "cores-a-string": (_profile(cores="many"), "cores", "an integer"),
    "cores-a-bool": (_profile(cores=True), "cores", "an integer"),
    "kind-unknown": (_profile(kind="tpu"), "kind", "npu, gpu, cpu"),
    "missing-bandwidth": (
        _profile(memory_bandwidth_gbs=KeyError),
        "memory_bandwidth_gbs",
        "missing",
    ),
    "missing-f32": (_profile(peak_gflops={"f16": 5.0}), "peak_gflops", "'f32'"),
    "unknown-key": (_profile(turbo=True), "turbo", "unknown key"),
    "negative-op-overhead": (_profile(op_overhead_us={"Shape": -1}), "op_overhead_us", "positive"),
    "billion-laughs": (_laughs() + "name: *a9\n", "", "aliases"),
    "python-tag": ("name: !!python/object/apply:os.system ['touch PWNED']\n", "", "python/obj"),
    "deep": ("extra: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "", "nested more than"),
    "a-list": ("- 1\n- 2\n", "", "must be a YAML mapping"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PROFILES))
def test_hostile_hardware_profile_names_file_and_field(case, tmp_path, monkeypatch):
    text, field, words = HOSTILE_PROFILES[case]
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"{case}.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(HardwareError) as info:
        load_profile(str(path))
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    assert f"key {field!r}" in msg if field else True, msg
    assert words in msg, msg
    assert len(msg) < 600
    assert not (tmp_path / "PWNED").exists()


def test_profile_errors_name_the_line():
    text = _profile(cores=-3)
    line = text.splitlines().index("cores: -3") + 1
    with pytest.raises(HardwareError, match=rf"^p\.yaml, line {line}: key 'cores': must be pos"):
        parse_profile_text(text, "p.yaml")


def test_hostile_profile_through_the_cli(tmp_path, capsys):
    model = write_model(tmp_path / "m.onnx")
    bad = tmp_path / "bad.yaml"
    bad.write_text(_profile(memory_bandwidth_gbs=float("nan")))
    for argv in (
        ["hardware", "show", str(bad)],
        ["analyze", model, "--hardware", str(bad)],
        ["fuse", model, "-o", str(tmp_path / "f.onnx"), "--hardware", str(bad)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("graph-autofusion: error: "), err
        assert str(bad) in err and "memory_bandwidth_gbs" in err
    assert not (tmp_path / "f.onnx").exists()


# ------------------------------------------------------------------ paths


def test_paths_with_spaces_and_non_ascii_characters(tmp_path, capsys):
    folder = tmp_path / "my models ünïcødé 模型"
    folder.mkdir()
    model = write_model(folder / "modèle d'essai.onnx")
    out = folder / "fusionné ✓.onnx"
    report = folder / "rapport é/analyse 分析.html"  # the report's folder is created
    assert main(["-q", "fuse", model, "-o", str(out), *FAST]) == 0, capsys.readouterr().err
    np.testing.assert_allclose(run(out), run(model), rtol=1e-5, atol=1e-6)
    assert main(["-q", "analyze", model, "--hardware", "x86_avx2", "--html", str(report)]) == 0
    assert report.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
    assert main(["-q", "verify", model, str(out)]) == 0
    rules = folder / "règles perso.yaml"
    rules.write_text(RULE, encoding="utf-8")
    assert main(["rules", "validate", str(rules)]) == 0
    assert "1 rule(s) OK" in capsys.readouterr().out
    leftovers = [p.name for p in folder.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def _snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def full_disk(monkeypatch):
    """Files created under the returned folder write to /dev/full: the kernel's real ENOSPC on
    the first write that reaches it (the file itself is created, so cleanup is exercised)."""
    real_open = os.open

    def make(folder):
        prefix = os.fspath(folder) + os.sep

        def open_(path, flags, mode=0o777, *, dir_fd=None):
            p = os.fspath(path)
            if flags & os.O_CREAT and os.path.abspath(p).startswith(prefix):
                os.close(real_open(p, flags, mode))
                return real_open("/dev/full", os.O_WRONLY)
            return real_open(path, flags, mode, dir_fd=dir_fd)

        monkeypatch.setattr(os, "open", open_)

    return make


@pytest.fixture()
def read_only(monkeypatch):
    """A read-only folder: chmod 0555, and (root ignores permissions) creating a file in it
    fails with the kernel's EACCES message, as it would for anyone else."""
    real_open, real_access = os.open, os.access

    def make(folder):
        folder.chmod(0o555)
        prefix = os.fspath(folder) + os.sep
        if os.geteuid() != 0:
            return

        def open_(path, flags, mode=0o777, *, dir_fd=None):
            if flags & os.O_CREAT and os.path.abspath(os.fspath(path)).startswith(prefix):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            return real_open(path, flags, mode, dir_fd=dir_fd)

        def access(path, mode, **kw):
            if mode & os.W_OK and os.path.abspath(os.fspath(path)) == prefix[:-1]:
                return False
            return real_access(path, mode, **kw)

        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "access", access)

    yield make


@pytest.mark.parametrize("trouble", ["full-disk", "read-only"])
def test_fuse_into_a_full_or_read_only_folder_writes_nothing(
    trouble, tmp_path, capsys, full_disk, read_only
):
    model = write_model(tmp_path / "m.onnx")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "fused.onnx").write_bytes(b"the user's old file")  # replaced only on success
    before, model_bytes = _snapshot(out_dir), open(model, "rb").read()
    (full_disk if trouble == "full-disk" else read_only)(out_dir)
    try:
        rc = main(["-q", "fuse", model, "-o", str(out_dir / "fused.onnx"), *FAST])
        err = capsys.readouterr().err
    finally:
        out_dir.chmod(0o755)
    assert rc == 2, err
    assert err.startswith("graph-autofusion: error: ") and err.count("\n") == 1, err
    assert str(out_dir / "fused.onnx") in err and "Traceback" not in err
    words = "No space left on device" if trouble == "full-disk" else "cannot write"
    assert words in err, err
    assert _snapshot(out_dir) == before  # the old file untouched, no temporary left
    assert open(model, "rb").read() == model_bytes


@pytest.mark.parametrize("trouble", ["full-disk", "read-only"])
def test_html_report_into_a_full_or_read_only_folder_writes_nothing(
    trouble, tmp_path, capsys, full_disk, read_only
):
    model = write_model(tmp_path / "m.onnx")
    out_dir = tmp_path / "reports"
    out_dir.mkdir()
    (out_dir / "r.html").write_text("old report")
    before = _snapshot(out_dir)
    (full_disk if trouble == "full-disk" else read_only)(out_dir)
    try:
        rc = main(["-q", "analyze", model, "--hardware", "x86_avx2", "--html", f"{out_dir}/r.html"])
        err = capsys.readouterr().err
    finally:
        out_dir.chmod(0o755)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(out_dir / "r.html") in err
    assert _snapshot(out_dir) == before


def test_a_device_as_output_is_refused_and_left_alone(tmp_path, capsys):
    model = write_model(tmp_path / "m.onnx")
    for argv in (
        ["fuse", model, "-o", "/dev/full", *FAST],
        ["analyze", model, "--hardware", "x86_avx2", "--html", "/dev/full"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "/dev/full" in err and "not a regular file" in err, err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # still the device, not a file


def test_save_profile_to_a_full_disk_keeps_the_old_profile(tmp_path, full_disk):
    from graph_autofusion.cost.hardware import save_profile

    dest = tmp_path / "hw" / "mine.yaml"
    dest.parent.mkdir()
    dest.write_text("old")
    full_disk(dest.parent)
    with pytest.raises(HardwareError, match=r"mine\.yaml: cannot write hardware profile: No sp"):
        save_profile(load_profile("a100"), dest)
    assert [p.name for p in dest.parent.iterdir()] == ["mine.yaml"]
    assert dest.read_text() == "old"


def test_every_error_above_is_a_graph_autofusion_error():
    for cls in (RuleFileError, HardwareError):
        assert issubclass(cls, GraphAutoFusionError)

"""Every user mistake on every command: exit status 2, exactly one line on stderr
(``graph-autofusion: error: ...`` naming the problem and the accepted values), no traceback,
nothing on stdout and nothing written (issue 14)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from graph_autofusion.cli import main
from tests.tiny_models import FAST, write_model

PREFIX = "graph-autofusion: error: "


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A good tiny model and one file of each kind of bad input, in one folder."""
    d = tmp_path_factory.mktemp("cli errors")
    f = {"dir": str(d), "model": write_model(d / "m.onnx")}
    (d / "not-onnx.onnx").write_bytes(b"this is not a protobuf \x00\x01\x02")
    (d / "empty.onnx").write_bytes(b"")
    (d / "folder.onnx").mkdir()
    (d / "bad-yaml.yaml").write_text("rules: [\n")
    (d / "bad-schema.yaml").write_text("rules:\n  - name: r\n    pattern: Relu(x)\n")
    (d / "text.npz").write_text("hello")
    np.savez(d / "wrong-name.npz", z=np.ones((2, 8), np.float32))
    np.savez(d / "wrong-shape.npz", x=np.ones((3, 8), np.float32))
    np.savez(d / "wrong-dtype.npz", x=np.ones((2, 8), np.float64))
    np.save(d / "array.npy", np.ones(3))
    for name in ("not-onnx.onnx", "empty.onnx", "folder.onnx", "bad-yaml.yaml", "bad-schema.yaml"):
        f[name] = str(d / name)
    for name in ("text.npz", "wrong-name.npz", "wrong-shape.npz", "wrong-dtype.npz", "array.npy"):
        f[name] = str(d / name)
    f["missing"] = str(d / "missing.onnx")
    f["out"] = str(d / "out" / "fused.onnx")
    os.mkdir(d / "out")
    return f


# (case id, argv with {placeholders} from `files`, words the one error line must hold)
CASES = [
    # unknown names: the accepted values are listed
    ("fuse-strategy", "fuse {model} -o {out} --strategy bogus", ["'bogus'", "'greedy'", "'dp'"]),
    ("analyze-strategy", "analyze {model} --strategy bogus", ["'bogus'", "'evolutionary'"]),
    ("fuse-preset", "fuse {model} -o {out} --preset bogus", ["'bogus'", "transformer", "cnn"]),
    ("match-preset", "match {model} --preset bogus", ["'bogus'", "llm"]),
    ("analyze-preset", "analyze {model} --preset bogus --hardware x86_avx2", ["'bogus'", "rnn"]),
    ("kernels-preset", "kernels {model} --preset bogus --hardware x86_avx2", ["'bogus'", "all"]),
    ("rules-list-preset", "rules list --preset bogus", ["'bogus'", "transformer"]),
    ("fuse-target", "fuse {model} -o {out} --target gpu", ["'gpu'", "'onnxruntime'", "'cpu'"]),
    ("analyze-target", "analyze {model} --target gpu", ["'gpu'", "'onnxruntime'"]),
    ("fuse-hardware", "fuse {model} -o {out} --hardware bogus", ["'bogus'", "a100", "x86_avx2"]),
    ("analyze-hardware", "analyze {model} --hardware bogus", ["'bogus'", "h100"]),
    ("kernels-hardware", "kernels {model} --hardware bogus", ["'bogus'", "arm_neon"]),
    ("hardware-show", "hardware show bogus", ["'bogus'", "ascend910b"]),
    ("bench-level", "bench {model} --level max", ["'max'", "'extended'"]),
    ("command", "frobnicate", ["'frobnicate'", "'fuse'", "'analyze'"]),
    ("no-command", "", ["required", "command"]),
    ("hardware-no-subcommand", "hardware", ["required"]),
    ("fuse-no-output", "fuse {model}", ["-o/--output", "required"]),
    ("unknown-option", "inspect {model} --colour", ["--colour"]),
    ("fuse-size-switch", "fuse {model} -o {out} --size-switch bad", ["'bad'", "RULE:INPUT[AXIS]"]),
    ("fuse-keep-fp32", "fuse {model} -o {out} --keep-fp32 Bogus", ["'Bogus'", "ReduceMean"]),
    ("fuse-stage", "fuse {model} -o {out} --stage nope", ["'nope'", "bias_gelu"]),
    ("fuse-custom-ops-cpu", "fuse {model} -o {out} --target cpu --custom-ops", ["onnxruntime"]),
    # rule files
    (
        "fuse-rules-missing",
        "fuse {model} -o {out} --rules {dir}/nope.yaml",
        ["nope.yaml", "No such"],
    ),
    ("match-rules-bad-yaml", "match {model} --rules {bad-yaml.yaml}", ["bad-yaml.yaml, line 2"]),
    ("analyze-rules-schema", "analyze {model} --rules {bad-schema.yaml}", ["'fused_op'"]),
    ("validate-missing", "rules validate {dir}/nope.yaml", ["nope.yaml", "not found"]),
    ("validate-bad-yaml", "rules validate {bad-yaml.yaml}", ["bad-yaml.yaml, line 2", "YAML"]),
    ("validate-schema", "rules validate {bad-schema.yaml}", ["missing required key", "fused_op"]),
    ("validate-folder", "rules validate {folder.onnx}", ["folder.onnx", "directory"]),
    ("hardware-show-bad-yaml", "hardware show {bad-yaml.yaml}", ["bad-yaml.yaml, line 2"]),
    # model paths and unreadable models, on every command that reads one
    *[
        (f"{cmd.split()[0]}-{kind}", cmd.replace("MODEL", "{" + kind + "}"), words)
        for cmd in (
            "inspect MODEL",
            "match MODEL",
            "analyze MODEL --hardware x86_avx2",
            "fuse MODEL -o {out}",
            "kernels MODEL --hardware x86_avx2",
            "verify {model} MODEL",
            "bench MODEL --runs 1",
        )
        for kind, words in (
            ("missing", ["missing.onnx"]),
            ("folder.onnx", ["folder.onnx", "directory"]),
            ("not-onnx.onnx", ["not-onnx.onnx", "ONNX"]),
            ("empty.onnx", ["empty.onnx", "ONNX"]),
        )
    ],
    ("verify-original-missing", "verify {missing} {model}", ["missing.onnx"]),
    ("bench-fused-missing", "bench {model} {missing}", ["missing.onnx"]),
    # --inputs
    *[
        (f"{cmd.split()[0]}-inputs-{kind}", cmd + " --inputs {" + kind + "}", words)
        for cmd in ("fuse {model} -o {out}", "kernels {model}", "verify {model} {model}")
        for kind, words in (
            ("text.npz", ["text.npz", "not an .npz", "numpy.savez"]),
            ("array.npy", ["array.npy", "not an .npz"]),
            ("wrong-name.npz", ["wrong-name.npz", "['z']", "x f32[2, 8]"]),
            ("wrong-shape.npz", ["wrong-shape.npz", "float32[3, 8]", "x f32[2, 8]"]),
            ("wrong-dtype.npz", ["wrong-dtype.npz", "float64", "f32"]),
        )
    ],
    ("bench-inputs-missing", "bench {model} --inputs {dir}/nope.npz", ["nope.npz", "not found"]),
    # numbers
    ("fuse-threshold", "fuse {model} -o {out} --benefit-threshold -0.1", ["[0, 1)", "'-0.1'"]),
    ("fuse-threshold-nan", "fuse {model} -o {out} --benefit-threshold nan", ["finite"]),
    ("analyze-threshold", "analyze {model} --benefit-threshold 1.5", ["[0, 1)"]),
    ("analyze-dim", "analyze {model} --dim B", ["SYMBOL=INT"]),
    ("match-cluster-nodes", "match {model} --max-cluster-nodes 0", [">= 1", "'0'"]),
    ("analyze-cluster-inputs", "analyze {model} --max-cluster-inputs -2", [">= 1"]),
    ("bench-runs", "bench {model} --runs 0", ["--runs", ">= 1"]),
    ("bench-threads", "bench {model} --threads 0", ["--threads", ">= 1"]),
    ("bench-runs-text", "bench {model} --runs many", ["integer", "'many'"]),
    ("kernels-runs", "kernels {model} --profile --runs 0", ["--runs", ">= 1"]),
    ("verify-cosine", "verify {model} {model} --cosine 2", ["[-1, 1]"]),
    ("demo-runs", "demo --runs 0", ["--runs", ">= 1"]),
    ("demo-seq-len", "demo --seq-len -1", ["--seq-len", ">= 1"]),
    ("demo-new-tokens", "demo --new-tokens 0", ["--new-tokens"]),
    # output paths, checked before any work
    ("fuse-output-folder-missing", "fuse {model} -o {dir}/no/such/f.onnx", ["no/such/f.onnx"]),
    ("fuse-output-is-a-folder", "fuse {model} -o {dir}", ["directory"]),
    ("fuse-output-is-the-input", "fuse {model} -o {model}", ["--overwrite"]),
    ("fuse-output-is-a-device", "fuse {model} -o /dev/full", ["/dev/full", "regular file"]),
    ("analyze-html-is-a-folder", "analyze {model} --html {dir}", ["directory"]),
    ("fuse-html-is-a-device", "fuse {model} -o {out} --html /dev/full", ["regular file"]),
    ("fuse-html-under-a-file", "fuse {model} -o {out} --html {model}/r.html", ["m.onnx"]),
    ("demo-html-is-a-device", "demo --html /dev/null", ["/dev/null", "regular file"]),
    ("calibrate-output-folder", "hardware calibrate -o {folder.onnx}", ["directory"]),
    ("calibrate-output-under-a-file", "hardware calibrate -o {model}/h.yaml", ["m.onnx"]),
]


def _argv(template: str, files: dict) -> list[str]:
    """``template``'s words with each ``{name}`` replaced by that file's path."""
    out = []
    for part in template.split():
        for key, path in files.items():
            part = part.replace("{" + key + "}", path)
        out.append(part)
    return out


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_each_mistake_is_one_line_and_status_2(case, files, capsys):
    _, template, words = next(c for c in CASES if c[0] == case)
    before = sorted(os.listdir(files["dir"])), sorted(os.listdir(os.path.dirname(files["out"])))
    rc = main(["-q", *_argv(template, files)])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert err.startswith(PREFIX) and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == "", (out, err)
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"
    after = sorted(os.listdir(files["dir"])), sorted(os.listdir(os.path.dirname(files["out"])))
    assert after == before  # nothing written, no temporary left


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_model_and_rule_file(files, tmp_path, capsys):
    model = tmp_path / "locked.onnx"
    model.write_bytes(open(files["model"], "rb").read())
    rules = tmp_path / "locked.yaml"
    rules.write_text("rules: []\n")
    model.chmod(0)
    rules.chmod(0)
    try:
        for argv in (["inspect", str(model)], ["rules", "validate", str(rules)]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "locked." in err and "not readable" in err
    finally:
        model.chmod(0o644)
        rules.chmod(0o644)


@pytest.mark.parametrize(
    "template, words",
    [
        ("fuse {model} -o {out} --strategy bogus", ["--strategy", "'bogus'", "'greedy'"]),
        ("fuse {missing} -o {out}", ["missing.onnx"]),
        ("rules validate {bad-yaml.yaml}", ["bad-yaml.yaml, line 2"]),
        ("analyze {model} --preset bogus --hardware x86_avx2", ["'bogus'", "transformer"]),
        ("verify {model} {not-onnx.onnx}", ["not-onnx.onnx"]),
    ],
)
def test_the_installed_command_in_a_fresh_process(template, words, files):
    """The real entry point (``python -m graph_autofusion``): what a user's shell sees."""
    proc = subprocess.run(
        [sys.executable, "-m", "graph_autofusion", *_argv(template, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(PREFIX) and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    for w in words:
        assert w in proc.stderr


def test_good_input_still_works(files, capsys):
    """The checks refuse mistakes only: the same commands with good input succeed."""
    good = os.path.join(files["dir"], "good.npz")
    np.savez(good, x=np.ones((2, 8), np.float32))
    out = os.path.join(files["dir"], "out", "good.onnx")
    assert main(["-q", "fuse", files["model"], "-o", out, "--inputs", good, *FAST]) == 0
    assert main(["-q", "verify", files["model"], out, "--inputs", good]) == 0
    assert main(["rules", "list", "--preset", "cnn"]) == 0
    assert main(["--version"]) == 0
    capsys.readouterr()
    os.remove(out)
    os.remove(good)

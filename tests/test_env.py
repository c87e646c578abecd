"""The environment variables the package reads (``graph_autofusion/env.py``): every read goes
through that module, and each is read when asked, so a value set at run time is seen."""

from __future__ import annotations

import ast
from pathlib import Path

from graph_autofusion import env
from graph_autofusion.codegen.compiler import CodegenOptions, cache_root
from graph_autofusion.cost.hardware import hardware_dir
from graph_autofusion.testing.export import cache_dir

PACKAGE = Path(__file__).resolve().parents[1] / "graph_autofusion"


def test_the_cache_folder_is_read_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv(env.CACHE, str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c" / "kernels"
    assert cache_dir() == tmp_path / "c"
    monkeypatch.setenv(env.HARDWARE_DIR, str(tmp_path / "hw"))
    assert hardware_dir() == tmp_path / "hw"


def test_compiler_and_flags(monkeypatch):
    monkeypatch.setenv("CC", "ccache gcc")
    assert CodegenOptions().compiler == "ccache gcc"
    assert env.c_compiler_argv() == ["ccache", "gcc"]
    monkeypatch.setenv(env.CUSTOM_OP_CFLAGS, "-DX=1  -O1")
    assert env.custom_op_cflags() == ("-DX=1", "-O1")
    monkeypatch.delenv("CC")
    assert env.c_compiler() == "cc"


def test_no_other_module_reads_the_environment():
    """``os.environ`` and ``os.getenv`` appear in env.py only (an AST search, so a comment or a
    docstring that names them does not count)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "env.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                if isinstance(node.value, ast.Name) and node.value.id == "os":
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, f"environment read outside graph_autofusion/env.py: {found}"

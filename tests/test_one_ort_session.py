"""One onnxruntime session helper: every session of the package, its benchmarks, tools and
tests is made by :func:`graph_autofusion.runtime.ort_session.ort_session` (threads, spinning,
optimization level and the custom-operator library decided in one place)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the call this test looks for (spelled in two pieces so that this file holds none)
CALL = "InferenceSession" + "("
#: the folders searched, every Python file under them
FOLDERS = ("graph_autofusion", "benchmarks", "tools", "tests")
#: where a direct call belongs: file -> (calls, why); None: any number
ALLOWED = {
    "graph_autofusion/runtime/ort_session.py": (None, "the helper itself"),
}


def _calls() -> dict[str, int]:
    found: dict[str, int] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            n = path.read_text(encoding="utf-8", errors="replace").count(CALL)
            if n:
                found[rel.as_posix()] = n
    return found


def test_every_onnxruntime_session_is_made_by_the_helper():
    found = _calls()
    stray = {p: n for p, n in found.items() if p not in ALLOWED}
    assert not stray, (
        f"onnxruntime sessions made directly (use graph_autofusion.runtime.ort_session."
        f"ort_session, adding a keyword argument if it lacks one): {stray}"
    )
    changed = {
        p: (found.get(p, 0), n)
        for p, (n, _why) in ALLOWED.items()
        if n is not None and found.get(p) != n
    }
    assert not changed, f"allowed direct calls changed (found, allowed): {changed}"


def test_the_search_finds_a_call(tmp_path, monkeypatch):
    """The search itself works: a stray call in a searched folder is reported."""
    import sys

    mod = sys.modules[__name__]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "stray.py").write_text(f"import onnxruntime as ort\nort.{CALL}'m')\n")
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    assert _calls() == {"tests/stray.py": 1}

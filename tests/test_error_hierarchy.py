"""Every error class of the package is rooted in GraphAutoFusionError; the modules that read
what users give raise nothing else (issue 14)."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import graph_autofusion
from graph_autofusion.errors import GraphAutoFusionError

#: modules that read user input (command line, files, options): every exception they raise on
#: purpose is a GraphAutoFusionError, or one of these (argparse turns ArgumentTypeError into
#: the CLI's one error line; SystemExit is the exit status; TypeError is a Python caller
#: passing the wrong kind of object)
USER_INPUT_MODULES = (
    "graph_autofusion.cli",
    "graph_autofusion.cli_args",
    "graph_autofusion.cli_analyze",
    "graph_autofusion.cost.hardware_cli",
    "graph_autofusion.cost.hardware",
    "graph_autofusion.cost.shapes",
    "graph_autofusion.patterns.yaml_rules",
    "graph_autofusion.patterns.rules",
    "graph_autofusion.patterns.constraints",
    "graph_autofusion.yaml_util",
    "graph_autofusion.options",
    "graph_autofusion.planner.controls",
    "graph_autofusion.planner.plan",
    "graph_autofusion.frontend.loader",
    "graph_autofusion.frontend.onnx_read",
    "graph_autofusion.api",
)
ALLOWED = {"ArgumentTypeError", "SystemExit", "TypeError"}
#: ``raise error(...)`` / ``raise self.fail(...)``: factories checked by
#: test_error_factories_make_graph_autofusion_errors
FACTORIES = {"error", "fail"}


def _modules():
    names = []
    for info in pkgutil.walk_packages(graph_autofusion.__path__, "graph_autofusion."):
        if info.name.endswith("__main__"):  # running it is the CLI
            continue
        names.append(info.name)
    return names


def test_every_exception_class_derives_from_graph_autofusion_error():
    names = _modules()
    assert len(names) > 100  # the walk found the package, not an empty path
    offenders = []
    for name in names:
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not issubclass(obj, Warning)  # warnings are not errors
                and not issubclass(obj, GraphAutoFusionError)
            ):
                offenders.append(f"{name}.{attr} ({', '.join(b.__name__ for b in obj.__mro__)})")
    assert offenders == []


@pytest.mark.parametrize(
    "where, name, builtin",
    [
        ("graph_autofusion.options", "OptionsError", ValueError),
        ("graph_autofusion.errors", "InputShapeError", ValueError),
        ("graph_autofusion.errors", "PathError", OSError),
        ("graph_autofusion.errors", "MissingFileError", FileNotFoundError),
        ("graph_autofusion.patterns.rules", "UnknownRuleError", KeyError),
        ("graph_autofusion.patterns.rules", "RuleDefinitionError", ValueError),
        ("graph_autofusion.patterns.constraints", "UnboundVariableError", KeyError),
        ("graph_autofusion.verify.subgraph", "SafetyCheckError", RuntimeError),
        ("graph_autofusion.testing.small_hf", "KnownExportFailure", RuntimeError),
    ],
)
def test_dual_inheritance_keeps_the_builtin_callers_catch(where, name, builtin):
    cls = getattr(importlib.import_module(where), name)
    assert issubclass(cls, GraphAutoFusionError) and issubclass(cls, builtin)


def _raised_names(path: Path):
    """``(line, name)`` of each ``raise Name(...)`` / ``raise mod.Name(...)`` in the file."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name):
                yield node.lineno, exc.id
            elif isinstance(exc, ast.Attribute):
                yield node.lineno, exc.attr


@pytest.mark.parametrize("name", USER_INPUT_MODULES)
def test_user_input_modules_raise_only_graph_autofusion_errors(name):
    module = importlib.import_module(name)
    path = Path(module.__file__)
    known = {**vars(importlib.import_module("graph_autofusion.errors")), **vars(module)}
    bad = []
    for line, exc in _raised_names(path):
        if exc in ALLOWED or exc in FACTORIES:
            continue
        cls = known.get(exc)
        if cls is None:  # imported inside the function that raises it
            for other in ("options", "patterns.rules", "errors", "cost.hardware"):
                cls = getattr(importlib.import_module(f"graph_autofusion.{other}"), exc, None)
                if cls is not None:
                    break
        if cls is None and hasattr(builtins, exc):
            cls = getattr(builtins, exc)
        if not (inspect.isclass(cls) and issubclass(cls, GraphAutoFusionError)):
            bad.append(f"{path.name}:{line}: raise {exc}")
    assert bad == []


def test_the_converted_errors_read_well():
    from graph_autofusion.cost.shapes import bind_symbols
    from graph_autofusion.errors import InputShapeError
    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.options import OptionsError
    from graph_autofusion.patterns.library import builtin_rules
    from graph_autofusion.patterns.rules import FusionRule, RuleDefinitionError, UnknownRuleError
    from graph_autofusion.planner.plan import plan

    model = parse_model(
        'model opset {"": 18}\ngraph g(%x: f32[B,4]) -> (%y) {\n  %y = Relu(%x)\n}\n'
    )
    with pytest.raises(InputShapeError, match="input 'x': dim 4 fed as 5"):
        bind_symbols(model, {"x": (2, 5)})
    with pytest.raises(UnknownRuleError) as info:
        builtin_rules().get("no_such_rule")
    assert str(info.value).startswith("no rule named 'no_such_rule'; rules: [")
    with pytest.raises(RuleDefinitionError, match="give a pattern, or op1 and op2"):
        FusionRule("r", fuse_pattern="F")
    with pytest.raises(OptionsError, match=r"known: \['auto', 'greedy', 'dp', 'evolutionary'\]"):
        plan([], strategy="bogus")


def test_error_factories_make_graph_autofusion_errors():
    import typing

    from graph_autofusion import yaml_util
    from graph_autofusion.patterns.yaml_rules import RuleFileError, _PatternParser

    assert isinstance(_PatternParser("rules.yaml, line 2", "").fail("x"), RuleFileError)
    for fn in (yaml_util.read_yaml_file, yaml_util.load_yaml_with_nodes):
        hint = typing.get_type_hints(fn)["error"]
        assert typing.get_args(hint) == (GraphAutoFusionError,)  # type[GraphAutoFusionError]


def test_running_a_model_without_an_input_names_the_inputs():
    """The torch runner's missing input is one of ours and still a KeyError."""
    from graph_autofusion.errors import MissingInputError
    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.runtime.torch_runtime import TorchRunner

    model = parse_model(
        'model opset {"": 18}\ngraph g(%x: f32[2], %y: f32[2]) -> (%z) {\n  %z = Add(%x, %y)\n}\n'
    )
    with pytest.raises(MissingInputError, match=r"missing graph input 'y'; inputs: \['x', 'y'\]"):
        TorchRunner(model).run({"x": np.ones(2, np.float32)})
    assert issubclass(MissingInputError, KeyError)

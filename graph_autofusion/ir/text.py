"""Text form of the IR, for test fixtures and dumps.

Example::

    model opset {"": 20, "com.microsoft": 1}
    graph main(%x: f32[B,8], %mask: f32[B,8]) -> (%y) {
      init %w: f32[8,8] = randn(0)
      init %two: f32[] = [2.0]
      %t: f32[B,8] = MatMul(%x, %w) @mm
      %s = Div(%t, %two)
      %y = Softmax<axis=-1>(%s)
    }

Grammar, one statement per line (``#`` starts a comment):

* ``model opset {...}``: optional first line, a JSON object of opset imports.
* ``graph NAME(%in: TYPE, ...) -> (%out, ...) {`` ... ``}``.
* ``init %name: TYPE = DATA`` where DATA is a list of numbers (row-major), ``randn(SEED)``,
  ``rand(SEED)``, ``zeros``, ``ones``, or ``elided`` (only with ``allow_elided=True``: zeros).
* ``%a[: TYPE], %b = [domain::]Op[<attr=value, ...>](%x, _, %y) [@node_name]``; ``_`` is an
  omitted optional input. Attribute values: ints, floats (with ``.`` or ``e``), ``"strings"``,
  lists of those, ``tensor(TYPE: [numbers])``.
* TYPE is ``dtype[dims]`` with dims ints, symbols or ``?``; ``dtype[...]`` is unknown rank.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from graph_autofusion.errors import TextParseError
from graph_autofusion.ir.core import Graph, Model, Node, RawAttribute, Value
from graph_autofusion.ir.dtypes import DType

_MAX_INLINE = 16


# ----------------------------------------------------------------------------- printing
def _fmt_num(x: Any) -> str:
    if isinstance(x, bool | np.bool_):
        return "1" if x else "0"
    if isinstance(x, int | np.integer):
        return str(int(x))
    r = repr(float(x))
    return r if ("." in r or "e" in r or "n" in r) else r + ".0"


def _fmt_attr(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bytes):
        return json.dumps(value.decode("utf-8", "replace"))
    if isinstance(value, np.ndarray):
        dt = DType.from_numpy(value.dtype)
        shape = ",".join(str(d) for d in value.shape)
        if value.size <= _MAX_INLINE:
            data = ", ".join(_fmt_num(x) for x in value.reshape(-1).tolist())
            return f"tensor({dt.short}[{shape}]: [{data}])"
        return f"tensor({dt.short}[{shape}]: elided)"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_fmt_attr(v) for v in value) + "]"
    if isinstance(value, RawAttribute):
        return "<raw>"
    if isinstance(value, int | float | np.number | bool):
        return _fmt_num(value)
    return json.dumps(str(value))


def _fmt_init(v: Value) -> str:
    arr = v.const
    assert arr is not None
    if arr.size <= _MAX_INLINE and arr.dtype != object:
        data = "[" + ", ".join(_fmt_num(x) for x in arr.reshape(-1).tolist()) + "]"
    else:
        data = "elided"
    return f"init %{v.name}: {v.type_str()} = {data}"


def _fmt_node(node: Node) -> str:
    outs = ", ".join(
        f"%{o.name}: {o.type_str()}"
        if (o.dtype is not None or o.shape is not None)
        else f"%{o.name}"
        for o in node.outputs
    )
    op = node.qualified_op
    if node.attrs:
        op += "<" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in node.attrs.items()) + ">"
    ins = ", ".join("%" + v.name if v is not None else "_" for v in node.inputs)
    return f"{outs} = {op}({ins}) @{node.name}"


def print_graph(graph: Graph, indent: str = "  ") -> str:
    """Render ``graph`` in the text form."""
    ins = ", ".join(f"%{v.name}: {v.type_str()}" for v in graph.inputs)
    outs = ", ".join(f"%{v.name}" for v in graph.outputs)
    lines = [f"graph {graph.name}({ins}) -> ({outs}) {{"]
    lines += [indent + _fmt_init(v) for v in graph.initializers.values()]
    lines += [indent + _fmt_node(n) for n in graph.nodes]
    lines.append("}")
    return "\n".join(lines)


def print_model(model: Model) -> str:
    """Render ``model`` (opset line + graph) in the text form."""
    return f"model opset {json.dumps(model.opset_imports)}\n" + print_graph(model.graph)


# ----------------------------------------------------------------------------- parsing
_TYPE_RE = re.compile(r"([a-z0-9?]+)\[([^\]]*)\]")
_GRAPH_RE = re.compile(r"^graph\s+([\w.\-]+)\s*\((.*)\)\s*->\s*\((.*)\)\s*\{$")
_INIT_RE = re.compile(r"^init\s+%([\w.\-/:]+)\s*:\s*(\S+\[[^\]]*\])\s*=\s*(.+)$")
_NODE_RE = re.compile(
    r"^(?P<outs>.+?)\s*=\s*(?P<op>(?:[\w.\-]+::)?[\w.\-]+)\s*(?:<(?P<attrs>.*)>)?\s*"
    r"\((?P<ins>[^()]*)\)\s*(?:@(?P<name>[\w.\-/:]+))?$"
)


def _parse_type(text: str, line_no: int) -> tuple[DType | None, tuple | None]:
    m = _TYPE_RE.fullmatch(text.strip())
    if not m:
        raise TextParseError(f"line {line_no}: bad type {text!r}; expected e.g. f32[2,?,N]")
    try:
        dt = None if m.group(1) == "?" else DType.from_short(m.group(1))
    except ValueError as e:
        raise TextParseError(f"line {line_no}: {e}") from None
    body = m.group(2).strip()
    if body == "...":
        return dt, None
    dims: list[Any] = []
    for d in [d.strip() for d in body.split(",")] if body else []:
        if d == "?":
            dims.append(None)
        elif re.fullmatch(r"-?\d+", d):
            dims.append(int(d))
        else:
            dims.append(d)
    return dt, tuple(dims)


def _scan(text: str):
    """Yield ``(index, char, quoted)``; ``quoted`` is True inside a double-quoted string
    (quotes included, backslash escapes honoured)."""
    quote = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
            yield i, ch, True
            continue
        if quote and ch == "\\":
            escaped = True
        elif ch == '"':
            quote = not quote
            yield i, ch, True
            continue
        yield i, ch, quote


def _strip_comment(line: str) -> str:
    """Drop a ``#`` comment that stands outside double quotes."""
    return next((line[:i] for i, ch, quoted in _scan(line) if ch == "#" and not quoted), line)


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and quotes."""
    parts, depth, cur = [], 0, []
    for _, ch, quoted in _scan(text):
        if not quoted:
            if ch in "[(<":
                depth += 1
            elif ch in "])>":
                depth -= 1
            elif ch == sep and depth == 0:
                parts.append("".join(cur))
                cur = []
                continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def _parse_number(tok: str) -> int | float:
    tok = tok.strip()
    if re.fullmatch(r"[+-]?\d+", tok):
        return int(tok)
    return float(tok)


def _parse_attr_value(text: str, line_no: int, allow_elided: bool = False) -> Any:
    text = text.strip()
    try:
        if text.startswith('"'):
            return json.loads(text)
        if text.startswith("tensor("):
            inner = text[len("tensor(") : -1]
            type_text, data = inner.split(":", 1)
            dt, shape = _parse_type(type_text, line_no)
            data = data.strip()
            if data == "elided":
                if not allow_elided:
                    raise TextParseError(f"line {line_no}: tensor attribute data is elided")
                return np.zeros(shape, dtype=dt.to_numpy())
            vals = [_parse_number(t) for t in _split_top(data[1:-1])]
            return np.array(vals, dtype=dt.to_numpy()).reshape(shape)
        if text.startswith("["):
            return [_parse_attr_value(t, line_no, allow_elided) for t in _split_top(text[1:-1])]
        return _parse_number(text)
    except TextParseError:
        raise
    except (ValueError, IndexError, TypeError, AttributeError) as e:
        raise TextParseError(f"line {line_no}: bad attribute value {text!r}: {e}") from None


def _parse_init_data(text: str, dt: DType, shape: tuple, line_no: int, allow_elided: bool):
    text = text.strip()
    npdt = dt.to_numpy()
    if not all(isinstance(d, int) for d in shape):
        raise TextParseError(f"line {line_no}: an initializer needs a static shape")
    if text in ("zeros", "ones"):
        return (np.zeros if text == "zeros" else np.ones)(shape, dtype=npdt)
    m = re.fullmatch(r"(randn|rand)\((\d+)\)", text)
    if m:
        rng = np.random.default_rng(int(m.group(2)))
        arr = rng.standard_normal(shape) if m.group(1) == "randn" else rng.random(shape)
        return arr.astype(npdt)
    if text == "elided":
        if not allow_elided:
            raise TextParseError(f"line {line_no}: initializer data is elided")
        return np.zeros(shape, dtype=npdt)
    if text.startswith("["):
        vals = [_parse_number(t) for t in _split_top(text[1:-1])]
        arr = np.array(vals, dtype=npdt)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise TextParseError(
                f"line {line_no}: initializer has {arr.size} values for shape {list(shape)}"
            )
        return arr.reshape(shape)
    raise TextParseError(f"line {line_no}: bad initializer data {text!r}")


def parse_model(text: str, *, allow_elided: bool = False) -> Model:
    """Parse the text form into a :class:`Model`.

    Raises:
        TextParseError: naming the line and what is wrong.
    """
    opsets: dict[str, int] = {"": 20}
    graph: Graph | None = None
    env: dict[str, Value] = {}
    outputs: list[str] = []
    closed = False
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if closed:
            raise TextParseError(f"line {line_no}: text after the closing '}}'")
        if line.startswith("model opset"):
            try:
                opsets = {str(k): int(v) for k, v in json.loads(line[len("model opset") :]).items()}
            except (ValueError, AttributeError) as e:
                raise TextParseError(f"line {line_no}: bad opset object: {e}") from None
            continue
        if graph is None:
            m = _GRAPH_RE.match(line)
            if not m:
                raise TextParseError(f"line {line_no}: expected 'graph NAME(...) -> (...) {{'")
            graph = Graph(m.group(1))
            for item in _split_top(m.group(2)):
                name, _, type_text = item.partition(":")
                dt, shape = _parse_type(type_text, line_no)
                v = graph.add_input(Value(name.strip().lstrip("%"), dt, shape))
                env[v.name] = v
            outputs = [o.strip().lstrip("%") for o in _split_top(m.group(3))]
            continue
        if line == "}":
            closed = True
            continue
        m = _INIT_RE.match(line)
        if m:
            dt, shape = _parse_type(m.group(2), line_no)
            if dt is None or shape is None:
                raise TextParseError(f"line {line_no}: an initializer needs dtype and shape")
            data = _parse_init_data(m.group(3), dt, shape, line_no, allow_elided)
            env[m.group(1)] = graph.add_initializer(m.group(1), data)
            continue
        m = _NODE_RE.match(line)
        if not m:
            raise TextParseError(f"line {line_no}: cannot parse statement {line!r}")
        op = m.group("op")
        domain, _, op_type = op.rpartition("::")
        attrs = {}
        if m.group("attrs"):
            for item in _split_top(m.group("attrs")):
                key, eq, val = item.partition("=")
                if not eq:
                    raise TextParseError(f"line {line_no}: attribute {item!r} lacks '='")
                attrs[key.strip()] = _parse_attr_value(val, line_no, allow_elided)
        inputs: list[Value | None] = []
        for tok in _split_top(m.group("ins")):
            if tok == "_":
                inputs.append(None)
                continue
            name = tok.lstrip("%")
            if name not in env:
                raise TextParseError(f"line {line_no}: %{name} is used before it is defined")
            inputs.append(env[name])
        outs = []
        for tok in _split_top(m.group("outs")):
            name, colon, type_text = tok.partition(":")
            dt, shape = _parse_type(type_text, line_no) if colon else (None, None)
            outs.append(Value(name.strip().lstrip("%"), dt, shape))
        node = Node(op_type, inputs, attrs, domain=domain, name=m.group("name") or "", outputs=outs)
        try:
            graph.add_node(node)
        except Exception as e:
            raise TextParseError(f"line {line_no}: {e}") from None
        for o in outs:
            env[o.name] = o
    if graph is None:
        raise TextParseError("line 1: no 'graph' statement found")
    if not closed:
        raise TextParseError("end of text: missing closing '}'")
    missing = [o for o in outputs if o not in env]
    if missing:
        raise TextParseError(f"graph outputs {missing} are never defined")
    graph.set_outputs([env[o] for o in outputs])
    return Model(graph, opsets)


def parse_graph(text: str, *, allow_elided: bool = False) -> Graph:
    """Parse the text form and return its graph."""
    return parse_model(text, allow_elided=allow_elided).graph

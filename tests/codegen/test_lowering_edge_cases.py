"""Edge cases a review found in the kernel generator, each checked against onnxruntime on
inputs other than the sample the kernel was planned with (a group that cannot be lowered
correctly must be refused, never computed wrong)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_autofusion.codegen.compiler import compile_library
from graph_autofusion.codegen.lower import KernelRefused, lower_group
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.pipeline.cpu import finalize_kernel
from graph_autofusion.runtime.kernels import load_library
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.torch_runtime import TorchRunner


class SampleBinding:
    """Concrete shapes of one sample run (what the analysis' ShapeBinding gives)."""

    def __init__(self, model, feeds):
        env = TorchRunner(model).run(
            {k: torch.from_numpy(v) for k, v in feeds.items()}, keep_all=True
        )
        self.shapes = {k: tuple(v.shape) for k, v in env.items()}

    def shape(self, v):
        return self.shapes.get(v.name)

    def dtype(self, v):
        return v.dtype


def _kernel(text, sample):
    m = parse_model(text)
    binding = SampleBinding(m, sample)
    low = lower_group(
        m.graph.nodes, list(m.graph.outputs), binding, opset=int(m.opset_imports.get("", 17))
    )
    shapes = [binding.shapes[i.name] for i in low.kernel.inputs]
    k = finalize_kernel(low.kernel, shapes)
    return m, k, load_library(compile_library([k])).kernel(k.name)


def _check(text, sample, others, *, rtol=1e-5, atol=1e-5, refused=None):
    """Lower on ``sample``; the kernel must equal onnxruntime on the sample and on ``others``.
    A refusal fails the test, unless ``refused`` (a regular expression of the reason) says
    the group must be refused: then anything else fails it."""
    if refused is not None:
        with pytest.raises(KernelRefused, match=refused):
            _kernel(text, sample)
        return None
    m, k, fn = _kernel(text, sample)
    sess = ort_session(to_onnx(m))
    for feeds in [sample, *others]:
        want = sess.run(None, feeds)
        for _ in range(3):  # repeated calls take the cached fast path
            got = fn(*[torch.from_numpy(feeds[i.name]) for i in k.inputs])
            for w, g in zip(want, got):
                assert g.shape == w.shape
                np.testing.assert_allclose(g.numpy(), w, rtol=rtol, atol=atol, equal_nan=True)
    return k


def _r(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_reduction_without_keepdims_over_an_inner_axis_at_other_batch_sizes():
    text = """model opset {"": 11}
graph g(%x: f32[B,16,8]) -> (%y) {
  %e = Exp(%x)
  %y = ReduceSum<axes=[1], keepdims=0>(%e)
}"""
    k = _check(text, {"x": _r(1, 16, 8)}, [{"x": _r(3, 16, 8)}, {"x": _r(2, 16, 8)}])
    assert k is not None


def test_a_view_that_copies_is_recomputed_on_every_call():
    text = """model opset {"": 17}
graph g(%x: f32[2,4,3,5], %r: f32[2,3,20]) -> (%y) {
  init %s: i64[3] = [2, 3, 20]
  %t = Transpose<perm=[0, 2, 1, 3]>(%x)
  %v = Reshape(%t, %s)
  %a = Add(%v, %r)
  %y = Relu(%a)
}"""
    assert _check(text, {"x": _r(2, 4, 3, 5), "r": _r(2, 3, 20)}, []) is not None


def test_reductions_after_a_leading_unsqueeze_use_the_value_rank():
    text = """model opset {"": 17}
graph g(%x: f32[4,4]) -> (%y) {
  init %ax: i64[1] = [0]
  %q = Relu(%x)
  %u = Unsqueeze(%q, %ax)
  %m = ReduceMean<axes=[1], keepdims=1>(%u)
  %y = Sub(%u, %m)
}"""
    assert _check(text, {"x": _r(4, 4)}, []) is not None


def test_expand_does_not_widen_the_value_it_expands():
    # the Expand's source read again, unexpanded, by a broadcast elementwise operator
    text = """model opset {"": 11}
graph g(%x: f32[4,1], %z: f32[4,8]) -> (%y) {
  init %shape: i64[2] = [4, 8]
  %e = Expand(%x, %shape)
  %r = Relu(%x)
  %a = Add(%e, %z)
  %y = Mul(%a, %r)
}"""
    assert _check(text, {"x": _r(4, 1), "z": _r(4, 8)}, []) is not None
    # ... and by a reduction over its axis of 1: refused (the reduced axis is broadcast)
    text = """model opset {"": 11}
graph g(%x: f32[4,1], %z: f32[4,8]) -> (%y) {
  init %shape: i64[2] = [4, 8]
  %e = Expand(%x, %shape)
  %s = ReduceSum<axes=[1], keepdims=1>(%x)
  %a = Add(%e, %z)
  %y = Add(%a, %s)
}"""
    _check(text, {"x": _r(4, 1), "z": _r(4, 8)}, [], refused="reduced axis is broadcast")


def test_opset_11_unsqueeze_takes_its_axes_attribute():
    text = """model opset {"": 11}
graph g(%x: f32[3,8], %b: f32[3,1,8]) -> (%y) {
  %u = Unsqueeze<axes=[1]>(%x)
  %a = Add(%u, %b)
  %y = Relu(%a)
}"""
    assert _check(text, {"x": _r(3, 8), "b": _r(3, 1, 8)}, []) is not None


def test_max_and_min_reductions_keep_nan_and_empty_rows_give_the_identity():
    text = """model opset {"": 17}
graph g(%x: f32[3,32]) -> (%y, %z) {
  %y = ReduceMax<axes=[1], keepdims=1>(%x)
  %z = ReduceMin<axes=[1], keepdims=1>(%x)
}"""
    x = _r(3, 32)
    x[0, 5] = np.nan
    m, k, fn = _kernel(text, {"x": x})
    y, z = fn(torch.from_numpy(x))
    # NaN propagates, as in torch.amax/amin and NumPy (onnxruntime's ReduceMin drops it)
    np.testing.assert_array_equal(y.numpy(), x.max(axis=1, keepdims=True))
    np.testing.assert_array_equal(z.numpy(), x.min(axis=1, keepdims=True))
    text_sum = """model opset {"": 11}
graph g(%x: f32[3,N]) -> (%y) {
  %e = Exp(%x)
  %y = ReduceSum<axes=[1], keepdims=1>(%e)
}"""
    assert _check(text_sum, {"x": _r(3, 4)}, [{"x": np.zeros((3, 0), np.float32)}]) is not None


def test_rank_0_and_squeeze_without_axes_and_sign_of_nan():
    text0 = """model opset {"": 17}
graph g(%x: f32[], %z: f32[]) -> (%y) {
  %a = Add(%x, %z)
  %y = Sign(%a)
}"""
    k = _check(text0, {"x": np.array(np.nan, np.float32), "z": np.array(1.0, np.float32)}, [])
    assert k is not None and k.rank == 1
    textsq = """model opset {"": 17}
graph g(%x: f32[B,1,8], %b: f32[8]) -> (%y) {
  %s = Squeeze(%x)
  %y = Add(%s, %b)
}"""
    # the sample has B = 1, which Squeeze would also remove: refused (only the declared 1s
    # may go; B is symbolic)
    _check(textsq, {"x": _r(1, 1, 8), "b": _r(8)}, [], refused="Squeeze")


def test_noop_reductions_keep_their_elementwise_part():
    text = """model opset {"": 18}
graph g(%x: f32[4]) -> (%y) {
  %y = ReduceSumSquare<noop_with_empty_axes=1>(%x)
}"""
    assert _check(text, {"x": _r(4)}, []) is not None


@pytest.mark.parametrize("to", [6])
def test_a_cast_to_int32_wraps_like_int32(to):
    text = f"""model opset {{"": 17}}
graph g(%x: i64[3]) -> (%y) {{
  %c = Cast<to={to}>(%x)
  %y = Cast<to=1>(%c)
}}"""
    x = np.array([1, 2**31, -(2**31) - 1], np.int64)
    assert _check(text, {"x": x}, []) is not None  # lowered, not refused


def test_a_concat_takes_its_leading_axes_and_branch_lengths_from_the_call():
    """No input outside the Concat carries the batch axis; a branch's symbolic last axis is 1
    in one call and broadcasts (found by review: the loop shape dropped the batch axis)."""
    text = """model opset {"": 17}
graph g(%a: f32[B,3], %c: f32[B,4], %z: f32[7]) -> (%y) {
  %ea = Exp(%a)
  %ec = Neg(%c)
  %cc = Concat<axis=-1>(%ea, %ec)
  %y = Add(%cc, %z)
}"""
    k = _check(text, {"a": _r(1, 3), "c": _r(1, 4), "z": _r(7)},
               [{"a": _r(4, 3), "c": _r(4, 4), "z": _r(7)}])  # fmt: skip
    assert k is not None and k.concat is not None
    text2 = """model opset {"": 17}
graph g(%p: f32[2,X], %q: f32[2,Y], %c: f32[2,4], %z: f32[2,1]) -> (%y) {
  %ea = Add(%p, %q)
  %cc = Concat<axis=-1>(%ea, %c)
  %y = Mul(%cc, %z)
}"""
    _check(text2, {"p": _r(2, 3), "q": _r(2, 3), "c": _r(2, 4), "z": _r(2, 1)},
           [{"p": _r(2, 1), "q": _r(2, 3), "c": _r(2, 4), "z": _r(2, 1)}])  # fmt: skip


def test_kernels_split_across_two_threads_match_onnxruntime():
    """`make test` runs each xdist worker on half the cores (one thread on 2 cores), so the
    OpenMP paths of the generated kernels (taken when nt > 1 and the work is large) are
    checked here with two threads: an elementwise and a reduction kernel, over sizes and
    row counts that do not split evenly."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.get_num_threads() == 2
        elementwise = """model opset {"": 17}
graph g(%x: f32[R,1000], %b: f32[1000]) -> (%y) {
  %a = Add(%x, %b)
  %s = Sigmoid(%a)
  %y = Mul(%a, %s)
}"""
        rows = [{"x": _r(n, 1000, seed=n), "b": _r(1000, seed=1)} for n in (63, 129, 2)]
        _check(elementwise, rows[0], rows[1:])
        reduction = """model opset {"": 18}
graph g(%x: f32[R,768]) -> (%y) {
  init %ax: i64[1] = [-1]
  %m = ReduceMean<keepdims=1>(%x, %ax)
  %d = Sub(%x, %m)
  %y = Mul(%d, %d)
}"""
        rows = [{"x": _r(n, 768, seed=n)} for n in (97, 128, 3)]
        _check(reduction, rows[0], rows[1:], rtol=1e-4, atol=1e-5)
    finally:
        torch.set_num_threads(before)

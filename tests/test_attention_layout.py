"""codegen.attention_layout: an opset-23 Attention takes the exporters' head split, KV-cache
Concats and head merge itself (3-D inputs, past/present), only when nothing else reads them."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.codegen.attention_layout import absorb_layout
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import random_feeds

TEXT = """model opset {{"": 23}}
graph g(%q3: f32[1,3,16], %k3: f32[1,3,8], %v3: f32[1,3,8], %pk: f32[1,2,4,4], %pv: f32[1,2,4,4], %mask: f32[1,1,3,7]) -> (%y, %prk, %prv{extra}) {{
  init %s4: i64[4] = [0, 0, 4, 4]
  init %s4k: i64[4] = [0, 0, -1, 4]
  init %s3: i64[3] = [0, 0, -1]
  %qr: f32[1,3,4,4] = Reshape(%q3, %s4)
  %q: f32[1,4,3,4] = Transpose<perm=[0, 2, 1, 3]>(%qr)
  %kr: f32[1,3,2,4] = Reshape(%k3, %s4k)
  %kn: f32[1,2,3,4] = Transpose<perm=[0, 2, 1, 3]>(%kr)
  %vr: f32[1,3,2,4] = Reshape(%v3, %s4k)
  %vn: f32[1,2,3,4] = Transpose<perm=[0, 2, 1, 3]>(%vr)
  %prk: f32[1,2,7,4] = Concat<axis=2>(%pk, %kn)
  %prv: f32[1,2,7,4] = Concat<axis=2>(%pv, %vn)
  %a: f32[1,4,3,4] = Attention<scale=0.5>(%q, %prk, %prv, %mask)
  %at: f32[1,3,4,4] = Transpose<perm=[0, 2, 1, 3]>(%a)
  %y: f32[1,3,16] = Reshape(%at, %s3)
}}
"""


def _ort(model, feeds):
    sess = ort_session(model, "all")
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_head_split_cache_and_merge_fold_into_one_attention():
    model, original = parse_model(TEXT.format(extra="")), parse_model(TEXT.format(extra=""))
    assert absorb_layout(model) == 1
    (att,) = model.graph.nodes
    assert att.op_type == "Attention" and [v.name for v in att.inputs] == [
        "q3",
        "k3",
        "v3",
        "mask",
        "pk",
        "pv",
    ]
    assert att.attrs["q_num_heads"] == 4 and att.attrs["kv_num_heads"] == 2
    assert [v.name for v in att.outputs] == ["y", "prk", "prv"]  # graph outputs keep their names
    feeds = random_feeds(original.graph, 0)
    want = run_model(original, feeds)
    for got in (run_model(model, feeds), _ort(model, feeds)):
        for name in ("y", "prk", "prv"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("extra", [", %q", ", %at"])
def test_a_layout_value_read_elsewhere_keeps_the_4d_form(extra):
    model = parse_model(TEXT.format(extra=extra))
    before = [n.op_type for n in model.graph.nodes]
    assert absorb_layout(model) == 0
    assert [n.op_type for n in model.graph.nodes] == before

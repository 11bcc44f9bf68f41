"""decode_step_cuda's per-place table counts every product kernel a built library runs
(a step's products in a layer's order, then the head), the pipelined down among them:
one it did not know would shift every later place by one."""

from __future__ import annotations

from bench.decode_step_cuda import by_position


def test_each_product_kernel_of_a_library_takes_its_place():
    layer = [("row_gemv_kernel_gdc", 3.0), ("attention_join_kernel_gdc", 4.0),
             ("row_gemv_kernel_gdc", 2.5), ("row_loop_kernel_gdc", 11.0),
             ("pipe_gemv_kernel_gdc", 7.0)]
    step = layer * 2 + [("head_argmax_kernel_gdc", 38.0), ("slot_token_kernel_gdc", 1.0)]
    found = by_position(step * 3, layers=2)
    assert found == {"qkv": 3.0, "o": 2.5, "gate_up": 11.0, "down": 7.0, "lm_head": 38.0}

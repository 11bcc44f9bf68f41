"""``Generation.int8_x_codes``: after --quantize int8-weight, a decode step's int8
products with the norm folded (q/k/v, gate/up, the head with its token) read x as int8
codes in blocks of 32 columns (passes/decode_kernels.py's ``x_qblock``); o and down keep
float x; off, nothing changes. The step computes the quantized-x math
(reference.row_gemv's ``x_qblock``) within int8 activations' error of the float step.
On the CPU, through the ops' reference kernels (the kernel: test_int8_dot4.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from targets.aoti.passes.decode_kernels import (X_QBLOCK, DecodeAttentionAsKernel,
                                                RowLinearsAsKernels)
from tests.targets.aoti.test_decode_kernels import _captured, _randomised

pytest.importorskip("transformers")
pytest.importorskip("torchao")

LAYERS = 2
OP = "edge_exporter.{}.default".format


@functools.cache  # the passes build new programs: one capture serves every test
def _int8_step(dtype=torch.float32):
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    program, past = _captured("llama", 1, dtype, next_token=True)
    program = DecodeAttentionAsKernel()(program).program
    return QuantizeWeightOnly("int8-weight", "weight-only", "cuda")(program).program, past


def _qblock(node) -> int:
    """The row_gemv's x_qblock, as a keyword or in its place after the counts."""
    return node.kwargs.get("x_qblock", node.args[14] if len(node.args) > 14 else 0)


def _run(program, past):
    with torch.no_grad():
        return program.module()(torch.tensor([[7]]), torch.tensor([9]),
                                *_randomised(past).values())


def test_normed_int8_products_read_x_codes_where_asked():
    step, past = _int8_step()
    plain = RowLinearsAsKernels(attention_o=True, advance_inputs=True)(step)
    codes = RowLinearsAsKernels(attention_o=True, advance_inputs=True,
                                int8_x_codes=True)(step)
    assert "int8_x_codes" not in plain.info
    assert codes.info["int8_x_codes"] == 2 * LAYERS + 1  # q/k/v and gate/up, the head
    assert {k: v for k, v in codes.info.items() if k != "int8_x_codes"} == plain.info
    rows = [n for n in codes.program.graph.nodes if str(n.target) == OP("row_gemv")]
    marked = [n for n in rows if _qblock(n)]
    assert len(marked) == 2 * LAYERS and {_qblock(n) for n in marked} == {X_QBLOCK}
    assert all(n.args[3] is not None for n in marked)  # each has its norm folded
    (head,) = [n for n in codes.program.graph.nodes
               if str(n.target) == OP("row_gemv_argmax_advance")]
    assert head.kwargs.get("x_qblock", head.args[-1]) == X_QBLOCK  # the token kernel's
    assert not any(_qblock(n) for n in plain.program.graph.nodes
                   if str(n.target) == OP("row_gemv"))
    got, want = _run(codes.program, past), _run(plain.program, past)
    assert list(got) == list(want)
    logits, float_logits = got["logits"].float(), want["logits"].float()
    assert not torch.equal(logits, float_logits)  # x's codes are not x
    assert ((logits - float_logits).norm() / float_logits.norm()).item() < 5e-2
    assert int(got["next_token"]) == int(logits[0, -1].argmax())


def test_the_cuda_target_reads_x_codes_and_the_pass_takes_it_from_the_facet(monkeypatch,
                                                                            tmp_path):
    """``Generation.int8_x_codes``: off in the facet's default, on for cuda (timed on a
    whole int8 build); the decode pass takes it from the facet."""
    import dataclasses

    from targets.aoti.cuda import CudaTarget
    from targets.aoti.kernels import ops
    from targets.base import LowerOptions
    from targets.facets.generation import Generation
    assert Generation().int8_x_codes is False and CudaTarget.generation.int8_x_codes is True
    if not ops.TRITON:
        pytest.skip("the cuda target places its decode kernels only with Triton installed")

    def asked():
        return [p.int8_x_codes for p in CudaTarget().default_passes(LowerOptions(tmp_path))
                if p.name == "row_linears_as_kernels"]
    assert asked() == [True]
    monkeypatch.setattr(CudaTarget, "generation",
                        dataclasses.replace(CudaTarget.generation, int8_x_codes=False))
    assert asked() == [False]

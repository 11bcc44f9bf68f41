"""The decode-step custom ops the cuda target's passes place (targets/aoti/passes/
decode_kernels.py): ``edge_exporter::row_gemv``, ``edge_exporter::row_gemv_argmax`` (the
head's product and the greedy token), ``edge_exporter::row_gemv_argmax_advance`` (the same,
writing the token and the next position into the step's own inputs: an op that says it
mutates them), ``edge_exporter::decode_attention`` and
``edge_exporter::decode_attention_store`` (the same, storing the new row in the cache
buffers it reads: an op of its own that says it mutates them, so a step that does not
store gets no copy of its cache), ``edge_exporter::decode_attention_o`` (an attention
and o's product after it, one launch) and ``edge_exporter::decode_attention_o_store``
(the same, storing the new row as decode_attention_store does) (their math: reference.py).

Where Triton is installed they are ``torch.library.triton_op``s: torch.export keeps them as
one node each, and AOTInductor traces into them and compiles their Triton kernels into the
library, so a device runs them with nothing registered. Without Triton (a CPU-only
machine) they are plain custom ops over the reference math, so graphs holding them can
still be captured, rewritten and checked there; the cuda target does not compile those.
"""

from __future__ import annotations

import importlib.util

import torch

from targets.aoti.kernels import reference

NAMESPACE = "edge_exporter"
ROW_GEMV = f"{NAMESPACE}::row_gemv"
ROW_GEMV_ARGMAX = f"{NAMESPACE}::row_gemv_argmax"
ROW_GEMV_ARGMAX_ADVANCE = f"{NAMESPACE}::row_gemv_argmax_advance"
DECODE_ATTENTION = f"{NAMESPACE}::decode_attention"
DECODE_ATTENTION_STORE = f"{NAMESPACE}::decode_attention_store"
DECODE_ATTENTION_O = f"{NAMESPACE}::decode_attention_o"
DECODE_ATTENTION_O_STORE = f"{NAMESPACE}::decode_attention_o_store"
_STORED = ("past_k", "past_v")  # what the store forms write
_ADVANCED = ("input_ids", "positions")  # what the advancing head writes
TRITON = importlib.util.find_spec("triton") is not None


def _row_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              norm_weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float,
              offset: float, act: int, weight_scale: torch.Tensor | None = None,
              rotary_cos: torch.Tensor | None = None,
              rotary_sin: torch.Tensor | None = None, rotary_rows: int = 0,
              head_dim: int = 0, counts: torch.Tensor | None = None,
              x_qblock: int = 0) -> torch.Tensor:
    """``counts``: int32 zeros the step's int8 products without a norm share with its
    attentions (the pass gives them): a dependent launch of rows too long to hold ahead
    is split along K and joined inside its kernel, which leaves them at zero.
    ``x_qblock``: int8 rows against x's int8 codes in blocks of that many columns
    (reference.row_gemv's math; Generation.int8_x_codes)."""
    if weight.dtype == torch.uint8 and not x_qblock:  # int4 rows, their groups' scales
        from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
        return launch_int4_row_gemv(x, weight, weight_scale, bias, norm_weight, residual,
                                    eps, offset, act, rotary_cos=rotary_cos,
                                    rotary_sin=rotary_sin, rotary_rows=rotary_rows,
                                    head_dim=head_dim)
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    return launch_row_gemv(x, weight, bias, norm_weight, residual, eps, offset, act,
                           weight_scale=weight_scale, rotary_cos=rotary_cos,
                           rotary_sin=rotary_sin, rotary_rows=rotary_rows,
                           head_dim=head_dim, counts=counts, x_qblock=x_qblock)


def _row_gemv_argmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     norm_weight: torch.Tensor | None, eps: float, offset: float,
                     weight_scale: torch.Tensor | None = None, x_qblock: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_gemv's logits, their argmax as int64 [1])."""
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    return launch_head_argmax(x, weight, bias, norm_weight, eps, offset, weight_scale,
                              x_qblock=x_qblock)


def _row_gemv_argmax_advance(x: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
                             eps: float, offset: float, weight_scale: torch.Tensor | None,
                             input_ids: torch.Tensor, positions: torch.Tensor,
                             x_qblock: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``_row_gemv_argmax`` whose token kernel also writes the token into ``input_ids``
    and adds one to ``positions`` (a greedy step's next inputs, in place)."""
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    return launch_head_argmax(x, weight, bias, norm_weight, eps, offset, weight_scale,
                              advance=(input_ids, positions), x_qblock=x_qblock)


def _decode_attention(query: torch.Tensor, past_k: torch.Tensor, new_k: torch.Tensor,
                      past_v: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor,
                      scale: float, cache_ahead: bool = False,
                      counts: torch.Tensor | None = None) -> torch.Tensor:
    """``cache_ahead``: the past rows are inputs no kernel of the step writes (the pass
    checks), so a dependent launch may read them before its wait. ``counts``: int32
    zeros the step's every attention shares (the pass gives them): the blocks are joined
    inside the split kernel, which leaves them at zero."""
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    return launch_decode_attention(query, past_k, new_k, past_v, new_v, mask, scale,
                                   cache_ahead=cache_ahead, counts=counts)


def _decode_attention_store(query: torch.Tensor, past_k: torch.Tensor, new_k: torch.Tensor,
                            past_v: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor,
                            scale: float, cache_ahead: bool, counts: torch.Tensor,
                            positions: torch.Tensor) -> torch.Tensor:
    """``_decode_attention`` joined in its split kernel, whose joining program also writes
    the new row into ``past_k``/``past_v`` at slot ``positions[0] % slots``."""
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    return launch_decode_attention(query, past_k, new_k, past_v, new_v, mask, scale,
                                   cache_ahead=cache_ahead, counts=counts,
                                   positions=positions)


def _decode_attention_o(query: torch.Tensor, past_k: torch.Tensor, new_k: torch.Tensor,
                        past_v: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor,
                        scale: float, cache_ahead: bool, counts: torch.Tensor,
                        weight: torch.Tensor, weight_scale: torch.Tensor | None,
                        residual: torch.Tensor, flags: torch.Tensor, slot: int,
                        reset: int) -> torch.Tensor:
    """The joined ``_decode_attention`` and o's ``_row_gemv`` (+ residual) in one launch;
    ``flags``: the step's int32 flag slots, ``slot``/``reset`` this launch's
    (kernels/attention_o_triton.py: the spin on them never gives up silently)."""
    from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
    return launch_decode_attention_o(query, past_k, new_k, past_v, new_v, mask, scale,
                                     cache_ahead, counts, weight, weight_scale, residual,
                                     flags, slot, reset)


def _decode_attention_o_store(query: torch.Tensor, past_k: torch.Tensor,
                              new_k: torch.Tensor, past_v: torch.Tensor,
                              new_v: torch.Tensor, mask: torch.Tensor, scale: float,
                              cache_ahead: bool, counts: torch.Tensor, weight: torch.Tensor,
                              weight_scale: torch.Tensor | None, residual: torch.Tensor,
                              flags: torch.Tensor, slot: int, reset: int,
                              positions: torch.Tensor) -> torch.Tensor:
    """``_decode_attention_o`` whose joining programs also write the new row into
    ``past_k``/``past_v`` at slot ``positions[0] % slots``."""
    from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
    return launch_decode_attention_o(query, past_k, new_k, past_v, new_v, mask, scale,
                                     cache_ahead, counts, weight, weight_scale, residual,
                                     flags, slot, reset, positions=positions)


def _o_shape(query, past_k, new_k, past_v, new_v, mask, scale, cache_ahead, counts, weight,
             weight_scale, residual, *rest):
    return residual.new_empty((*residual.shape[:-1], weight.shape[0]))


def _define() -> None:
    if TRITON:
        row = torch.library.triton_op(ROW_GEMV, _row_gemv, mutates_args=())
        head = torch.library.triton_op(ROW_GEMV_ARGMAX, _row_gemv_argmax, mutates_args=())
        attention = torch.library.triton_op(DECODE_ATTENTION, _decode_attention,
                                            mutates_args=())
        # the CPU has no Triton kernels here: the reference math serves it
        row.register_kernel("cpu", reference.row_gemv)
        head.register_kernel("cpu", reference.row_gemv_argmax)
        attention.register_kernel("cpu", reference.decode_attention)
        advance = torch.library.triton_op(ROW_GEMV_ARGMAX_ADVANCE, _row_gemv_argmax_advance,
                                          mutates_args=_ADVANCED)
        advance.register_kernel("cpu", reference.row_gemv_argmax_advance)
        store = torch.library.triton_op(DECODE_ATTENTION_STORE, _decode_attention_store,
                                        mutates_args=_STORED)
        store.register_kernel("cpu", reference.decode_attention_store)
        joined = torch.library.triton_op(DECODE_ATTENTION_O, _decode_attention_o,
                                         mutates_args=())
        joined.register_kernel("cpu", reference.decode_attention_o)
        stored = torch.library.triton_op(DECODE_ATTENTION_O_STORE, _decode_attention_o_store,
                                         mutates_args=_STORED)
        stored.register_kernel("cpu", reference.decode_attention_o_store)
        return
    row = torch.library.custom_op(ROW_GEMV, mutates_args=(),
                                  schema=torch.library.infer_schema(_row_gemv,
                                                                    mutates_args=()))(
        reference.row_gemv)
    row.register_fake(lambda x, weight, bias, norm_weight, residual, eps, offset, act,
                      *rest, **named: x.new_empty(reference.row_gemv_shape(x, weight, act)))
    head = torch.library.custom_op(ROW_GEMV_ARGMAX, mutates_args=(),
                                   schema=torch.library.infer_schema(_row_gemv_argmax,
                                                                     mutates_args=()))(
        reference.row_gemv_argmax)
    head.register_fake(lambda x, weight, *rest: (
        x.new_empty(reference.row_gemv_shape(x, weight, 0)),
        x.new_empty((1,), dtype=torch.int64)))
    advance = torch.library.custom_op(
        ROW_GEMV_ARGMAX_ADVANCE, mutates_args=_ADVANCED,
        schema=torch.library.infer_schema(_row_gemv_argmax_advance,
                                          mutates_args=_ADVANCED))(
        reference.row_gemv_argmax_advance)
    advance.register_fake(lambda x, weight, *rest: (
        x.new_empty(reference.row_gemv_shape(x, weight, 0)),
        x.new_empty((1,), dtype=torch.int64)))
    attention = torch.library.custom_op(
        DECODE_ATTENTION, mutates_args=(),
        schema=torch.library.infer_schema(_decode_attention, mutates_args=()))(
        reference.decode_attention)
    attention.register_fake(lambda query, past_k, new_k, past_v, new_v, mask, scale, *rest:
                            query.new_empty((*query.shape[:-1], past_v.shape[-1])))
    store = torch.library.custom_op(
        DECODE_ATTENTION_STORE, mutates_args=_STORED,
        schema=torch.library.infer_schema(_decode_attention_store, mutates_args=_STORED))(
        reference.decode_attention_store)
    store.register_fake(lambda query, past_k, new_k, past_v, new_v, mask, scale, *rest:
                        query.new_empty((*query.shape[:-1], past_v.shape[-1])))
    joined = torch.library.custom_op(
        DECODE_ATTENTION_O, mutates_args=(),
        schema=torch.library.infer_schema(_decode_attention_o, mutates_args=()))(
        reference.decode_attention_o)
    joined.register_fake(_o_shape)
    stored = torch.library.custom_op(
        DECODE_ATTENTION_O_STORE, mutates_args=_STORED,
        schema=torch.library.infer_schema(_decode_attention_o_store, mutates_args=_STORED))(
        reference.decode_attention_o_store)
    stored.register_fake(_o_shape)


_define()
row_gemv = torch.ops.edge_exporter.row_gemv.default
row_gemv_argmax = torch.ops.edge_exporter.row_gemv_argmax.default
row_gemv_argmax_advance = torch.ops.edge_exporter.row_gemv_argmax_advance.default
decode_attention = torch.ops.edge_exporter.decode_attention.default
decode_attention_store = torch.ops.edge_exporter.decode_attention_store.default
decode_attention_o = torch.ops.edge_exporter.decode_attention_o.default
decode_attention_o_store = torch.ops.edge_exporter.decode_attention_o_store.default

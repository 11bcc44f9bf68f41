"""The cuda target's decode-step kernels: the passes that place them (graph matching,
checked on the CPU through the ops' reference kernels) and the Triton kernels themselves
against that reference math (GPU only, marked cuda)."""

from __future__ import annotations

import collections

import pytest
import torch

from exporter.lm.wrapper import ExportableCausalLM, probe_layout
from passes.fusion.merge_linears import MergeParallelLinears
from targets.aoti.kernels import reference
from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from tests.models import tiny_lm

pytest.importorskip("transformers")


def _captured(family: str, tokens: int, dtype: torch.dtype = torch.float32,
              next_token: bool = False):
    """A tiny decoder's step as the cuda target captures it (SDPA over the cache), with
    its parallel linears merged as the target's passes merge them (``next_token``: the
    step returning its greedy token too)."""
    model = tiny_lm.model(family).to(dtype)
    layout = probe_layout(model, 32, dtype)
    wrapper = ExportableCausalLM(model, layout, attention="sdpa").eval()
    if next_token:
        wrapper = wrapper.with_next_token()
    past = {f"{kind}_{i}": torch.zeros(1, *shape[:1], layer.slots, shape[1], dtype=dtype)
            for i, layer in enumerate(layout.layers)
            for kind, shape in (("k", layer.key_shape), ("v", layer.value_shape))}
    ids = torch.randint(3, tiny_lm.VOCAB, (1, tokens), generator=torch.Generator().manual_seed(0))
    dims = None
    if tokens > 1:
        length = torch.export.Dim.DYNAMIC(min=2, max=16)
        dims = ({1: length}, {0: length}, {name: None for name in past})
    with torch.no_grad():
        program = torch.export.export(wrapper, (ids, torch.arange(tokens), past),
                                      dynamic_shapes=dims)
    return MergeParallelLinears()(program).program, past


def _calls(program) -> collections.Counter:
    return collections.Counter(str(n.target) for n in program.graph.nodes
                               if n.op == "call_function")


def _randomised(past: dict) -> dict:
    generator = torch.Generator().manual_seed(3)
    return {name: torch.randn(t.shape, generator=generator).to(t.dtype)
            for name, t in past.items()}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decode_step_products_and_attention_become_fused_kernel_ops(family):
    """Each layer's q/k/v (its RMSNorm folded in), o (the residual add folded in),
    gate/up (norm and SiLU-times-up folded in) and down (residual) products become one
    row_gemv each, the head one with the final norm, the queries' and keys' rotary
    embedding q/k/v's epilogue, and SDPA over cat(past, new) the decode attention op
    reading the cache in place; the step computes what it did."""
    program, past = _captured(family, 1)
    attention = DecodeAttentionAsKernel()(program)
    result = RowLinearsAsKernels()(attention.program)
    layers = 2
    # the mask and the join's counts every layer's attention reads, and the rotary cos
    # and sin every q/k/v product reads, each stored once (decode_stored.py)
    assert attention.info == {"attention_as_kernel": layers, "cache_ahead": layers,
                              "stored_once": 2}
    assert result.info == {"linears_as_kernels": 4 * layers + 1, "int8_linears": 0,
                           "int4_linears": 0, "norms_folded": 2 * layers + 1, "gated_folded": layers,
                           "residuals_folded": 2 * layers, "rotary_folded": layers,
                           "argmax_in_head": 0, "split_counts": 0, "stored_once": 2}
    calls = _calls(result.program)
    assert calls["edge_exporter.row_gemv.default"] == 4 * layers + 1
    assert calls["edge_exporter.decode_attention.default"] == layers
    assert not {"aten.linear.default", "aten.scaled_dot_product_attention.default",
                "aten.silu.default", "aten.rsqrt.default", "aten.neg.default"} & set(calls)
    qkv = [n for n in result.program.graph.nodes if n.target == ops_row_gemv()][0]
    heads = tiny_lm.model(family).config
    head_dim = heads.hidden_size // heads.num_attention_heads
    assert qkv.args[11:] == ((heads.num_attention_heads + heads.num_key_value_heads)
                             * head_dim, head_dim)  # queries and keys rotated, not values
    masks = {n.args[5] for n in result.program.graph.nodes
             if str(n.target) == "edge_exporter.decode_attention.default"}
    turns = {tuple(n.args[9:11]) for n in result.program.graph.nodes
             if n.target == ops_row_gemv() and len(n.args) > 9}
    counts = {n.args[8] for n in result.program.graph.nodes
              if str(n.target) == "edge_exporter.decode_attention.default"}
    assert len(masks) == 1 and len(turns) == 1 and len(counts) == 1  # one for every layer
    assert all(str(n.target) == "prims.inductor_force_stride_order.default"
               for n in (*masks, *counts, *next(iter(turns))))
    assert next(iter(counts)).meta["val"].dtype == torch.int32
    cache_inputs = {n for n in result.program.graph.nodes if n.op == "placeholder"
                    and n.name.startswith("past")}
    assert not [n for n in result.program.graph.nodes if str(n.target) == "aten.cat.default"
                and cache_inputs & set(n.args[0])]  # the cache is read in place, not copied
    cache = _randomised(past)
    ids, position = torch.tensor([[7]]), torch.tensor([9])
    with torch.no_grad():  # merged in place: as captured; re-captured: flat
        want = program.module()(ids, position, cache)
        got = result.program.module()(ids, position, *cache.values())
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_weight_only_products_become_the_kernel_over_int8_rows(dtype):
    """After --quantize int8-weight each product is torchao's decomposed int8 linear
    (the int8 weight converted, a matmul, each row's scale, which an fp16 model keeps
    float32 and casts at use): it becomes one row_gemv over the int8 rows and their
    scales, with the norm, the gated activation, Qwen's q/k/v bias and the residual
    folded in as for float weights, and the step computes what it did."""
    pytest.importorskip("torchao")
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    program, past = _captured("qwen2", 1, dtype)
    program = DecodeAttentionAsKernel()(program).program
    quantized = QuantizeWeightOnly("int8-weight", "weight-only", "cuda")(program).program
    result = RowLinearsAsKernels()(quantized)
    layers = 2
    assert result.info == {"linears_as_kernels": 4 * layers + 1, "int8_linears": 4 * layers + 1,
                           "int4_linears": 0, "norms_folded": 2 * layers + 1, "gated_folded": layers,
                           "residuals_folded": 2 * layers, "rotary_folded": layers,
                           "argmax_in_head": 0, "split_counts": 2 * layers,
                           "stored_once": 2}
    calls = _calls(result.program)
    assert not {"aten.mm.default", "aten.silu.default"} & set(calls)
    weights = {n.name: n for n in result.program.graph.nodes if n.op == "placeholder"}
    int8 = [n for n in result.program.graph.nodes if n.target == ops_row_gemv()
            and weights[n.args[1].name].meta["val"].dtype == torch.int8]
    assert len(int8) == 4 * layers + 1 and all(n.args[8] is not None for n in int8)
    assert sum(n.args[2] is not None for n in int8) == layers  # each q/k/v's bias
    # o and down (no norm, gate or rotary rows) may be split along K: they and the
    # attentions share one buffer of join counters, a count for each row at least
    attentions = [n for n in result.program.graph.nodes if n.target == ops_decode_attention()]
    split = [n for n in int8 if len(n.args) > 13]
    assert len(split) == 2 * layers and all(n.args[3] is None and not n.args[7]
                                            for n in split)
    shared = {n.args[13] for n in split} | {n.args[8] for n in attentions}
    assert len(shared) == 1 and len(attentions) == layers
    size = max(weights[n.args[1].name].meta["val"].shape[0] for n in split)
    assert shared.pop().meta["val"].shape == (size,)
    # in place of the attentions' own (the model's mask is a zeros too)
    assert calls["aten.zeros.default"] == _calls(program)["aten.zeros.default"]
    cache = _randomised(past)
    ids, position = torch.tensor([[7]]), torch.tensor([9])
    with torch.no_grad():
        want = quantized.module()(ids, position, *cache.values())
        got = result.program.module()(ids, position, *cache.values())
    close = 1e-4 if dtype == torch.float32 else 1e-2  # fp16: the graph rounds each op
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=close, atol=close)


def ops_row_gemv():
    from targets.aoti.kernels import ops
    return ops.row_gemv


def ops_decode_attention():
    from targets.aoti.kernels import ops
    return ops.decode_attention


def test_attention_reads_ahead_only_past_rows_no_op_of_the_step_writes():
    """The step's cache inputs, which the runtime writes after the step, are marked (a
    dependent kernel reads them before its wait); an input the graph writes through a
    view, or rows the step computed, are not."""
    from targets.aoti.passes.decode_patterns import unwritten_input
    program, _ = _captured("llama", 1)
    result = DecodeAttentionAsKernel()(program).program
    marked = [n.args[7] for n in result.graph.nodes
              if str(n.target) == "edge_exporter.decode_attention.default"]
    assert marked == [True, True]
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    written, kept, rows = (graph.placeholder(name) for name in ("written", "kept", "rows"))
    window = graph.call_function(aten.slice.Tensor, (written, 2, 0, 4))
    graph.call_function(aten.copy_.default, (graph.call_function(aten.view.default, (
        window, [1, 2, 4, 8])), rows))
    computed = graph.call_function(aten.add.Tensor, (kept, rows))
    read = graph.call_function(aten.view.default, (kept, [1, 2, 16, 8]))
    graph.output((computed, read))
    assert not unwritten_input(written) and not unwritten_input(window)
    assert unwritten_input(kept) and unwritten_input(read)
    assert not unwritten_input(computed)


def test_prompt_chunks_of_dynamic_length_keep_their_products_and_attention():
    """A prefill step's row count is not known at capture: nothing there is one row."""
    program, _ = _captured("llama", 4)
    assert not DecodeAttentionAsKernel()(program).modified
    assert not RowLinearsAsKernels()(program).modified


def test_cuda_target_places_the_decode_kernels_before_the_single_row_reductions(tmp_path):
    from targets import get_target
    from targets.aoti.kernels import ops
    from targets.base import LowerOptions
    if not ops.TRITON:
        pytest.skip("the decode kernels need Triton")
    names = [p.name for p in get_target("cuda").default_passes(LowerOptions(tmp_path))]
    # the timed attention choice (attention_kernels.py) may sit between them
    assert names[-1] == "single_row_linears_as_reductions"
    assert names.index("decode_attention_as_kernel") < names.index("row_linears_as_kernels")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("case", [  # (N, K, norm, act, residual, bias): odd sizes too
    (37, 200, True, 1, False, True), (96, 64, False, 3, True, False),
    (2560, 2048, True, 0, False, False), (2048, 5632, False, 2, True, True)])
def test_row_gemv_kernel_matches_its_reference(case, dtype):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    n, k, norm, act, res, bias = case
    torch.manual_seed(n + k)
    cuda = dict(device="cuda", dtype=dtype)
    weight = torch.randn(2 * n if act else n, k, **cuda) * 0.05
    x = torch.randn(1, 1, k, **cuda)
    args = (torch.randn(weight.shape[0], **cuda) if bias else None,
            torch.rand(k, **cuda) + 0.5 if norm else None,
            torch.randn(1, 1, n, **cuda) if res else None, 1e-6, 0.0, act)
    want = reference.row_gemv(x, weight, *args).float()
    got = launch_row_gemv(x, weight, *args).float()
    assert got.shape == want.shape
    assert ((got - want).norm() / want.norm()).item() < (2e-3 if dtype == torch.float16
                                                         else 1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(32, 4, 64, 2048), (4, 2, 16, 200)])  # (H, KVH, D, K)
def test_row_gemv_kernel_rotates_the_first_rows_as_its_reference(shape, dtype):
    """q/k/v with the rotary embedding of its query and key heads in the epilogue: each
    row's partner half a head away is in the same program, every block size."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    heads, kv_heads, dim, k = shape
    torch.manual_seed(dim)
    cuda = dict(device="cuda", dtype=dtype)
    rotated = (heads + kv_heads) * dim
    weight = torch.randn(rotated + kv_heads * dim, k, **cuda) * 0.05
    x = torch.randn(1, 1, k, **cuda)
    angle = 9.0 / 10000 ** (torch.arange(0, dim, 2, device="cuda") / dim)
    cos, sin = (f(torch.cat([angle, angle])).to(dtype).view(1, 1, 1, dim)
                for f in (torch.cos, torch.sin))
    args = (None, torch.rand(k, **cuda) + 0.5, None, 1e-6, 0.0, 0)
    turn = dict(rotary_cos=cos, rotary_sin=sin, rotary_rows=rotated, head_dim=dim)
    want = reference.row_gemv(x, weight, *args, **turn).float()
    assert not torch.allclose(want, reference.row_gemv(x, weight, *args).float())
    for config in (None, (2, 64, 4, 0), (8, 64, 4, 0)):
        got = launch_row_gemv(x, weight, *args, config=config, **turn).float()
        assert ((got - want).norm() / want.norm()).item() < (2e-3 if dtype == torch.float16
                                                             else 1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("case", [  # (N, K, norm, act, residual, bias)
    (37, 200, True, 1, False, True), (2560, 2048, True, 0, False, False),
    (5632, 2048, True, 1, False, False), (2048, 5632, False, 0, True, True)])
def test_row_gemv_kernel_over_int8_rows_matches_its_reference(case):
    """fp16 rows against int8 weight rows, each row's scale applied to its sum."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    n, k, norm, act, res, bias = case
    torch.manual_seed(n + k)
    cuda = dict(device="cuda", dtype=torch.float16)
    rows = 2 * n if act else n
    weight = torch.randint(-127, 128, (rows, k), device="cuda", dtype=torch.int8)
    scale = torch.rand(rows, **cuda) * 1e-3 + 1e-4
    x = torch.randn(1, 1, k, **cuda)
    args = (torch.randn(rows, **cuda) if bias else None,
            torch.rand(k, **cuda) + 0.5 if norm else None,
            torch.randn(1, 1, n, **cuda) if res else None, 1e-6, 0.0, act)
    want = reference.row_gemv(x, weight, *args, weight_scale=scale).float()
    got = launch_row_gemv(x, weight, *args, weight_scale=scale)
    assert got.dtype == torch.float16 and got.shape == want.shape
    assert ((got.float() - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("config", [  # (BLOCK_N, BLOCK_K, warps, AHEAD, TILE_X)
    (4, 512, 4, 0, True), (8, 256, 4, 64, True), (2, 1024, 4, 0, True),
    (2, 256, 8, 0, False)])
@pytest.mark.parametrize("case", [  # (N, K, norm, act, residual, bias)
    (37, 200, True, 1, False, True), (2048, 5632, False, 0, True, False)])
def test_row_gemv_loop_forms_match_the_reference(case, config, int8):
    """x read as a tile of the weights' shape (and as a row), with odd sizes, columns
    loaded ahead, int8 rows: the reference math either way."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    n, k, norm, act, res, bias = case
    torch.manual_seed(n + k + config[1])
    cuda = dict(device="cuda", dtype=torch.float16)
    rows = 2 * n if act else n
    weight = (torch.randint(-127, 128, (rows, k), device="cuda", dtype=torch.int8) if int8
              else torch.randn(rows, k, **cuda) * 0.05)
    scale = torch.rand(rows, **cuda) * 1e-3 + 1e-4 if int8 else None
    x = torch.randn(1, 1, k, **cuda)
    args = (torch.randn(rows, **cuda) if bias else None,
            torch.rand(k, **cuda) + 0.5 if norm else None,
            torch.randn(1, 1, n, **cuda) if res else None, 1e-6, 0.0, act)
    want = reference.row_gemv(x, weight, *args, weight_scale=scale).float()
    got = launch_row_gemv(x, weight, *args, config=config, weight_scale=scale).float()
    assert got.shape == want.shape
    assert ((got - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(32, 4, 512, 64), (6, 6, 70, 80), (8, 1, 33, 16),
                                   (8, 2, 5000, 64)])
def test_decode_attention_kernel_matches_its_reference(shape, dtype):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    heads, kv_heads, slots, dim = shape
    torch.manual_seed(slots)
    cuda = dict(device="cuda", dtype=dtype)
    q = torch.randn(1, heads, 1, dim, **cuda)
    past_k, past_v = (torch.randn(1, kv_heads, slots, dim, **cuda) for _ in "kv")
    new_k, new_v = (torch.randn(1, kv_heads, 1, dim, **cuda) for _ in "kv")
    mask = torch.zeros(1, 1, 1, slots + 1, **cuda)
    mask[..., slots // 2:slots] = torch.finfo(dtype).min  # slots not yet written
    want = reference.decode_attention(q, past_k, new_k, past_v, new_v, mask, dim ** -0.5)
    got = launch_decode_attention(q, past_k, new_k, past_v, new_v, mask, dim ** -0.5)
    error = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert error < (2e-3 if dtype == torch.float16 else 1e-5)


@pytest.mark.cuda
def test_kernels_started_as_dependent_launches_wait_for_what_they_read():
    """A chain of products and attention, each reading the one before's output, started
    as programmatic dependent launches inside a CUDA graph: the same numbers as the
    reference math one op at a time (a kernel that read before the one before had
    written would not be)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    torch.manual_seed(5)
    cuda = dict(device="cuda", dtype=torch.float16)
    hidden, heads, kv_heads, dim, slots = 512, 8, 2, 64, 96
    qkv_w = [torch.randn(hidden + 2 * kv_heads * dim, hidden, **cuda) * 0.05 for _ in range(3)]
    up_w = [torch.randn(2 * 1024, hidden, **cuda) * 0.05 for _ in range(3)]
    down_w = [torch.randn(hidden, 1024, **cuda) * 0.05 for _ in range(3)]
    norm = torch.rand(hidden, **cuda) + 0.5
    caches = [[torch.randn(1, kv_heads, slots, dim, **cuda) for _ in "kv"] for _ in range(3)]
    mask = torch.zeros(1, 1, 1, slots + 1, **cuda)
    x = torch.randn(1, 1, hidden, **cuda)

    def chain(gemv, attention):
        h = x
        for qkv_weight, up, down, (past_k, past_v) in zip(qkv_w, up_w, down_w, caches):
            qkv = gemv(h, qkv_weight, None, norm, None, 1e-5, 0.0, 0)
            q = qkv[..., :hidden].view(1, heads, 1, dim)
            k = qkv[..., hidden:hidden + kv_heads * dim].view(1, kv_heads, 1, dim)
            v = qkv[..., hidden + kv_heads * dim:].view(1, kv_heads, 1, dim)
            h = h + attention(q, past_k, k, past_v, v, mask, dim ** -0.5).view(1, 1, hidden)
            gated = gemv(h, up, None, norm, None, 1e-5, 0.0, 1)
            h = gemv(gated, down, None, None, h, 1e-5, 0.0, 0)
        return h

    want = chain(reference.row_gemv, reference.decode_attention).float()
    graph = torch.cuda.CUDAGraph()
    dependent = (lambda *a: launch_row_gemv(*a, pdl=True),
                 lambda *a: launch_decode_attention(*a, pdl=True))
    chain(*dependent)  # compiled before capture
    with torch.cuda.graph(graph):
        got = chain(*dependent)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert ((got.float() - want).norm() / want.norm()).item() < 5e-3

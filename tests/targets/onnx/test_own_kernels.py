"""targets/onnx/kernels: the onnx target's own int8/int4 GEMV kernels in ONNX Runtime compute
what MatMulNBits computes (the same int8 activation blocks, the same integer sums), at one
row and several (the prefill path takes four rows at once, the rest one by one), for
widths that are not a multiple of the block and output counts not a multiple of four;
its decode attention computes what GroupQueryAttention computes. The GEMV tests run twice:
on the tiles this CPU gets (AVX-512 VNNI where it has it) and on the AVX2 tiles, forced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.executors.ort_kernels import register_kernels
from runtime.host.platforms import host_platform

from targets.onnx.kernels import ISA_ENV, LIBRARY, compile_library, unusable
from targets.onnx.kernels.rewrite import DOMAIN, rewrite

pytestmark = pytest.mark.skipif(unusable(host_platform()) is not None,
                                reason="the kernels are x86-64 AVX2+FMA C, compiled here")

K, N = 320, 202  # 320 = 2.5 blocks of 128; 202 rows = 50 groups of four and two more


@pytest.fixture(params=["this-cpu", "avx2"])
def isa(request, monkeypatch):
    """Which tiles the library picks when a session registers it (nbits_rows.c)."""
    if request.param == "avx2":
        monkeypatch.setenv(ISA_ENV, "avx2")
    else:
        monkeypatch.delenv(ISA_ENV, raising=False)
    return request.param


def _model(path, glu: bool = False, norm: bool = False):
    """x @ w, or a LLaMA MLP's packed gate/up as the onnx target exports it: the
    product split in halves, silu(gate) * up; ``norm``: x is first ORT's
    SkipSimplifiedLayerNormalization of (x, skip), whose sum is an output too."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(0).standard_normal((K, N)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["normed" if norm else "x", "w"],
                              ["p" if glu else "y"])]
    tables = [numpy_helper.from_array(w, "w")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "s", K])
              for n in (("x", "skip") if norm else ("x",))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                             [1, "s", N // 2 if glu else N])]
    if norm:
        nodes.insert(0, helper.make_node("SkipSimplifiedLayerNormalization",
                                         ["x", "skip", "gamma"], ["normed", "", "", "sum"],
                                         domain="com.microsoft", epsilon=1e-5))
        tables.append(numpy_helper.from_array(
            np.linspace(0.5, 1.5, K).astype(np.float32), "gamma"))
        outputs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, [1, "s", K]))
    if glu:
        nodes += [helper.make_node("Split", ["p", "halves"], ["gate", "up"], axis=2),
                  helper.make_node("Sigmoid", ["gate"], ["sig"]),
                  helper.make_node("Mul", ["gate", "sig"], ["silu"]),
                  helper.make_node("Mul", ["silu", "up"], ["y"])]
        tables.append(numpy_helper.from_array(np.array([N // 2, N // 2]), "halves"))
    graph = helper.make_graph(nodes, "g", inputs, outputs, tables)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]),
              str(path))


def _on_ours(path, tmp_path) -> tuple[dict[str, int], object]:
    """The model at ``path`` rewritten as a build rewrites it, in a session with the
    library registered as the runtime registers it: (nodes moved, session)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    moved = rewrite(model)
    onnx.save(model, str(tmp_path / "ours.onnx"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    register_kernels(options, compile_library(tmp_path / LIBRARY), "test", str(path))
    return moved, ort.InferenceSession(str(tmp_path / "ours.onnx"), options)


def _db(want, got) -> float:
    return float(10 * np.log10((want ** 2).sum() / max(((want - got) ** 2).sum(), 1e-30)))


@pytest.mark.parametrize("recipe,block,glu,norm", [("int8-weight", 256, False, False),
                                                   ("int4-weight", 128, False, False),
                                                   ("int8-weight", 64, False, False),
                                                   ("int4-weight", 256, False, False),
                                                   ("int4-weight", 128, True, False),
                                                   ("int8-weight", 256, True, True),
                                                   ("int4-weight", 128, False, True)])
def test_our_kernels_compute_what_matmulnbits_computes(tmp_path, isa, recipe, block, glu,
                                                       norm):
    import onnx
    import onnxruntime as ort

    from targets.onnx.quantize import quantize_model
    _model(tmp_path / "float.onnx", glu, norm)
    x = np.random.default_rng(1).standard_normal((1, 11, K)).astype(np.float32)
    feeds = {"x": x, **({"skip": x[:, ::-1] * 0.5} if norm else {})}
    model, _ = quantize_model(tmp_path / "float.onnx", recipe, [],
                              [[torch.from_numpy(v.copy()) for v in feeds.values()]],
                              block=block)
    path = tmp_path / "quantized.onnx"
    onnx.save(model, str(path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    theirs = ort.InferenceSession(str(path), options)
    moved, ours = _on_ours(path, tmp_path)
    rewritten = onnx.load(str(tmp_path / "ours.onnx"))
    name = "MatMulNBits" + "Norm" * norm + "GLU" * glu
    assert moved == {name: 1} and [(n.domain, n.op_type) for n in rewritten.graph.node] == [
        (DOMAIN, name)]
    for rows in (1, 4, 5, 11):  # one row (decode); prefill: 4 at once, and 1 or 3 more
        given = {k: np.ascontiguousarray(v[:, :rows]) for k, v in feeds.items()}
        want, got = theirs.run(None, given), ours.run(None, given)
        assert got[0].shape == want[0].shape == (1, rows, N // 2 if glu else N)
        assert all(_db(w, g) > 100 for w, g in zip(want, got))  # sums in another order


def _nbits_model(K: int, N: int, bits: int, block: int) -> bytes:
    """One MatMulNBits of random codes and scales, rewritten onto our kernels."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(N)
    nb, blob = -(-K // block), block * bits // 8
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft",
                            K=K, N=N, bits=bits, block_size=block, accuracy_level=4)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", N])],
        [numpy_helper.from_array(rng.integers(0, 256, (N, nb, blob), dtype=np.uint8), "w"),
         numpy_helper.from_array((rng.random(N * nb) * 0.01).astype(np.float32), "s")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    assert rewrite(model) == {"MatMulNBits": 1}
    return model.SerializeToString()


@pytest.mark.parametrize("bits,block,N", [(4, 512, 201), (8, 512, 203), (4, 128, 203),
                                          (8, 256, 201)])
def test_rows_at_once_compute_what_one_row_at_a_time_computes(tmp_path, isa, bits, block,
                                                              N):
    """The prefill tiles (four rows, two weight rows at a time, 4-bit sums folded per 256
    weights) against the decode GEMV on each row alone, any block and output count."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(str(compile_library(tmp_path / LIBRARY)))
    ours = ort.InferenceSession(_nbits_model(1100, N, bits, block), options)
    x = np.random.default_rng(bits).standard_normal((1, 13, 1100)).astype(np.float32)
    for rows in (4, 7, 13):
        together = ours.run(None, {"x": x[:, :rows]})[0]
        alone = np.concatenate([ours.run(None, {"x": x[:, i:i + 1]})[0]
                                for i in range(rows)], axis=1)
        assert _db(alone, together) > 100


@pytest.mark.parametrize("bits,block", [(4, 512), (8, 512), (8, 1024)])
def test_past_256_our_products_are_as_near_float_math_as_onnx_runtimes(tmp_path, isa, bits,
                                                                        block):
    """Past blocks of 256 MLAS quantizes the activations in smaller pieces than a weight
    block, so its op and ours differ by an activation rounding (~42 dB) there: ours must be
    as near the float product of the dequantized weights as its op is (within 1 dB)."""
    import onnx
    import onnxruntime as ort

    K, N = 2048, 64
    ours_model = onnx.load_from_string(_nbits_model(K, N, bits, block))
    node = ours_model.graph.node[0]
    node.domain, node.op_type = "com.microsoft", "MatMulNBits"  # the op, as it was
    codes, scales = (onnx.numpy_helper.to_array(t) for t in ours_model.graph.initializer)
    if bits == 4:
        codes = np.stack([codes & 15, codes >> 4], -1).reshape(N, -1)
    weight = (codes.reshape(N, -1)[:, :K].astype(np.float64) - 2 ** (bits - 1)) * \
        np.repeat(scales.reshape(N, -1), block, axis=1)[:, :K]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    theirs = ort.InferenceSession(ours_model.SerializeToString(), options)
    options.register_custom_ops_library(str(compile_library(tmp_path / LIBRARY)))
    ours = ort.InferenceSession(_nbits_model(K, N, bits, block), options)
    x = np.random.default_rng(1).standard_normal((1, 5, K)).astype(np.float32)
    exact = x.astype(np.float64) @ weight.T
    for rows in (1, 5):
        given = {"x": x[:, :rows]}
        op_db = _db(exact[:, :rows], theirs.run(None, given)[0])
        assert op_db > 35  # the float math above is the op's
        assert _db(exact[:, :rows], ours.run(None, given)[0]) > op_db - 1.0


def test_only_the_nodes_the_kernels_take_are_moved():
    from onnx import helper

    def node(bits, block, inputs=3, level=4):
        return helper.make_node("MatMulNBits", ["a", "b", "s", "z"][:inputs], ["y"],
                                domain="com.microsoft", K=256, N=8, bits=bits,
                                block_size=block, accuracy_level=level)
    nodes = [node(8, 256), node(4, 128), node(4, 32), node(2, 64), node(8, 128, inputs=4),
             node(8, 256, level=0)]  # float activations: not what the kernel computes
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert rewrite(model) == {"MatMulNBits": 2}
    assert [n.domain for n in model.graph.node][:2] == [DOMAIN] * 2
    assert {n.domain for n in model.graph.node[2:]} == {"com.microsoft"}


HEADS, KV_HEADS, D, SLOTS = 4, 2, 16, 32


def _attention_model(path):
    """The onnx target's decoder attention: one GroupQueryAttention over packed q/k/v rows
    with the rotary inside, the cache as past and present."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    angles = np.arange(SLOTS)[:, None] / 10000 ** (np.arange(D // 2) / (D // 2))
    cache = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, KV_HEADS, SLOTS, D])
             for n in ("past_k", "past_v")]
    node = helper.make_node(
        "GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total",
                                "cos", "sin"], ["out", "present_k", "present_v"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        do_rotary=1, rotary_interleaved=0)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("qkv", TensorProto.FLOAT,
                                       [1, "s", (HEADS + 2 * KV_HEADS) * D]), *cache,
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
         helper.make_tensor_value_info("total", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "s", HEADS * D]),
         *[helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, KV_HEADS, SLOTS, D])
           for n in ("present_k", "present_v")]],
        [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
         numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]),
              str(path))


@pytest.mark.parametrize("past,rows", [(0, 5), (7, 1), (30, 2)])
def test_our_attention_computes_what_group_query_attention_computes(tmp_path, past, rows):
    import onnxruntime as ort

    _attention_model(tmp_path / "attention.onnx")
    rng = np.random.default_rng(past)
    feeds = {"qkv": rng.standard_normal((1, rows, (HEADS + 2 * KV_HEADS) * D)),
             "past_k": rng.standard_normal((1, KV_HEADS, SLOTS, D)),
             "past_v": rng.standard_normal((1, KV_HEADS, SLOTS, D))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    feeds |= {"seqlens_k": np.array([past + rows - 1], np.int32),
              "total": np.array(past + rows, np.int32)}
    want = ort.InferenceSession(str(tmp_path / "attention.onnx")).run(None, feeds)
    moved, ours = _on_ours(tmp_path / "attention.onnx", tmp_path)
    got = ours.run(None, feeds)
    assert moved == {"GroupQueryAttention": 1} and got[0].shape == want[0].shape == (1, rows, HEADS * D)
    assert _db(want[0], got[0]) > 100
    # the cache up to the new rows (slots past them are not the op's to define)
    assert all(_db(w[:, :, :past + rows], g[:, :, :past + rows]) > 100
               for w, g in zip(want[1:], got[1:]))

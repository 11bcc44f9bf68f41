"""The ONNX Runtime executor's IO-binding hot path (runtime/executors/ort_binding.py).

It binds the inputs' memory by pointer and keeps small outputs bound between calls, so
what must hold is that nothing stale leaks: every call computes on the tensors it was
given (moved, reshaped, changed in place, transposed) and no result is overwritten by a
later call. Each case compares with plain ``session.run`` on numpy copies.
"""

from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("onnxruntime")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from runtime.errors import ExecutionError  # noqa: E402
from runtime.executors import create_executor  # noqa: E402
from runtime.executors.ort_binding import COPY_LIMIT, outputs_follow_inputs  # noqa: E402
from runtime.format.manifest import Partition  # noqa: E402

FLOAT = TensorProto.FLOAT


def _executor(tmp_path, nodes, inputs, outputs, initializers=(), in_place=None):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    (tmp_path / "p0").mkdir(exist_ok=True)
    onnx.save(model, str(tmp_path / "p0" / "model.onnx"))
    partition = Partition(
        name="p0", backend="onnxruntime", device="cpu", files=("p0/model.onnx",),
        inputs=tuple(i.name for i in inputs),
        outputs=tuple(o.name for o in outputs if o.name not in (in_place or {})),
        meta={"model": "p0/model.onnx", "providers": ["CPUExecutionProvider"],
              **({"in_place": in_place} if in_place else {})})
    run = create_executor(partition, tmp_path, where="test")
    return run


def _plain(run, inputs):
    """What plain ORT computes on numpy copies of the inputs."""
    session = run.session
    feeds = {arg.name: t.numpy().copy() for arg, t in zip(session.get_inputs(), inputs)}
    return [torch.from_numpy(a) for a in session.run(None, feeds)]


@pytest.fixture
def affine(tmp_path):
    """y = x @ W + b and z = 2x, batch dynamic: two small outputs."""
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    bias = numpy_helper.from_array(np.array([1, 2, 3], np.float32), "b")
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    return _executor(
        tmp_path,
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["y"]),
         helper.make_node("Mul", ["x", "two"], ["z"])],
        [helper.make_tensor_value_info("x", FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", FLOAT, ["n", 3]),
         helper.make_tensor_value_info("z", FLOAT, ["n", 4])], [weight, bias, two])


def test_every_call_computes_on_its_own_inputs_and_keeps_earlier_results(affine):
    x = torch.randn(2, 4)
    steps = [("first", lambda: x), ("same tensor", lambda: x),
             ("changed in place", lambda: x.mul_(3)), ("new tensor", lambda: torch.randn(2, 4)),
             ("new batch", lambda: torch.randn(5, 4)), ("back to the first", lambda: x),
             ("empty batch", lambda: torch.randn(0, 4)), ("slice at an offset", lambda: x[1:])]
    kept = []
    for name, make in steps:
        tensor = make()
        got, want = affine([tensor]), _plain(affine, [tensor])
        assert all(torch.equal(g, w) for g, w in zip(got, want)), name
        kept.append((name, got, [w.clone() for w in want]))
    for name, got, want in kept:  # later calls wrote into none of them
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{name} was overwritten"


def test_a_transposed_view_of_the_bound_memory_is_not_taken_for_it(tmp_path):
    """Same pointer, shape and dtype as the tensor bound before, other strides."""
    double = _executor(tmp_path, [helper.make_node("Add", ["x", "x"], ["y"])],
                       [helper.make_tensor_value_info("x", FLOAT, [3, 3])],
                       [helper.make_tensor_value_info("y", FLOAT, [3, 3])])
    x = torch.arange(9.0).reshape(3, 3)
    assert torch.equal(double([x])[0], 2 * x)
    assert torch.equal(double([x.t()])[0], 2 * x.t())
    assert torch.equal(double([x])[0], 2 * x)


@pytest.mark.parametrize("dtype, onnx_type", [(torch.int64, TensorProto.INT64),
                                               (torch.float64, TensorProto.DOUBLE),
                                               (torch.bool, TensorProto.BOOL),
                                               (torch.float16, TensorProto.FLOAT16)])
def test_identity_in_each_dtype_hands_out_copies(tmp_path, dtype, onnx_type):
    """Identity makes ORT copy the input into the kept output buffer; the caller's result
    must not change when that buffer is written again."""
    same = _executor(tmp_path, [helper.make_node("Identity", ["x"], ["y"])],
                     [helper.make_tensor_value_info("x", onnx_type, ["n"])],
                     [helper.make_tensor_value_info("y", onnx_type, ["n"])])
    first = torch.tensor([1, 0, 1], dtype=dtype)
    results = [same([first])[0] for _ in range(3)]
    second = torch.tensor([0, 1, 0], dtype=dtype)
    assert torch.equal(same([second])[0], second)
    assert all(torch.equal(r, first) and r.dtype == dtype for r in results)


def test_large_outputs_are_fresh_buffers(tmp_path):
    columns = COPY_LIMIT // 4 + 1  # one row of float32 is over the copy limit
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    plus_one = _executor(tmp_path, [helper.make_node("Add", ["x", "one"], ["y"])],
                         [helper.make_tensor_value_info("x", FLOAT, ["n", columns])],
                         [helper.make_tensor_value_info("y", FLOAT, ["n", columns])], [one])
    x = torch.zeros(1, columns)
    results = [plus_one([x.fill_(float(i))])[0] for i in range(3)]
    assert [r[0, 0].item() for r in results] == [1.0, 2.0, 3.0]
    assert len({r.data_ptr() for r in results}) == 3


def test_output_shapes_that_follow_the_data(tmp_path):
    """NonZero's output size depends on the values. Declared honestly (an unnamed dim) the
    outputs are never kept bound; declared as if the input shape fixed it, a kept buffer
    of the wrong size makes ORT fail once and the executor stops keeping them."""
    def nonzero(folder, declared):
        folder.mkdir()
        return _executor(folder, [helper.make_node("NonZero", ["x"], ["y"])],
                         [helper.make_tensor_value_info("x", FLOAT, ["n"])],
                         [helper.make_tensor_value_info("y", TensorProto.INT64, declared)])
    for declared in ([1, None], [1, "n"]):
        run = nonzero(tmp_path / str(declared[1]), declared)
        assert outputs_follow_inputs(run.session) is (declared[1] == "n")
        for values in ([0, 1, 2, 3], [0, 0, 2, 3], [1, 1, 1, 1], [0, 0, 0, 0], [5, 0, 5, 0]):
            x = torch.tensor(values, dtype=torch.float32)
            assert torch.equal(run([x])[0], torch.nonzero(x).t()), (declared, values)


def test_threads_do_not_share_bindings(affine):
    errors: list[str] = []

    def worker(rows: int) -> None:
        for _ in range(200):
            x = torch.randn(rows, 4)
            if not torch.equal(affine([x])[0], _plain(affine, [x])[0]):
                errors.append(f"thread with batch {rows} got another's result")
                return

    threads = [threading.Thread(target=worker, args=(rows,)) for rows in (1, 2, 3, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_inputs_it_cannot_bind_take_the_plain_path(affine):
    with pytest.raises(ExecutionError, match="bfloat16"):
        affine([torch.randn(2, 4, dtype=torch.bfloat16)])
    with pytest.raises(ExecutionError, match="takes 1 inputs, got 2"):
        affine([torch.randn(2, 4), torch.randn(2, 4)])
    wide = torch.randn(2, 8)[:, ::2]  # strided: ORT gets numpy's copy
    assert torch.equal(affine([wide])[0], _plain(affine, [wide.contiguous()])[0])
    assert torch.equal(affine([torch.ones(2, 4)])[1], torch.full((2, 4), 2.0))


def test_a_cache_updated_in_place_is_written_where_it_lies(tmp_path):
    """GroupQueryAttention's present outputs bound onto the past inputs' memory
    (``in_place``): the new rows land in the caller's cache tensors, only the attention
    comes back, and it equals plain ORT's (which fills a present buffer of its own)."""
    heads, kv_heads, dim, slots = 4, 2, 8, 16
    info = helper.make_tensor_value_info
    cache = [info(name, FLOAT, [1, kv_heads, slots, dim]) for name in ("pk", "pv")]
    run = _executor(
        tmp_path,
        [helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens",
                                                  "total"], ["o", "prk", "prv"],
                          domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads)],
        [info("q", FLOAT, [1, "t", heads * dim]), info("k", FLOAT, [1, "t", kv_heads * dim]),
         info("v", FLOAT, [1, "t", kv_heads * dim]), *cache,
         info("seqlens", TensorProto.INT32, [1]), info("total", TensorProto.INT32, [])],
        [info("o", FLOAT, [1, "t", heads * dim]), info("prk", FLOAT, [1, kv_heads, slots, dim]),
         info("prv", FLOAT, [1, kv_heads, slots, dim])],
        in_place={"prk": "pk", "prv": "pv"})
    past_k, past_v = torch.randn(1, kv_heads, slots, dim), torch.randn(1, kv_heads, slots, dim)
    for start, length in ((0, 3), (3, 1), (4, 2)):
        new = [torch.randn(1, length, n * dim) for n in (heads, kv_heads, kv_heads)]
        lengths = [torch.tensor([start + length - 1], dtype=torch.int32),
                   torch.tensor(start + length, dtype=torch.int32)]
        inputs = [*new, past_k, past_v, *lengths]
        expected = _plain(run, [t.clone() for t in inputs])[0]
        got = run(inputs)
        rows = new[1].view(1, length, kv_heads, dim).transpose(1, 2)
        assert len(got) == 1 and torch.allclose(got[0], expected, atol=1e-6)
        assert torch.equal(past_k[:, :, start:start + length], rows)  # written in place

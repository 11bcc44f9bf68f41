"""Outputs a GPU step's library stored into its cache inputs (``AotiMeta.stored_outputs``:
the decode attention's new K/V rows, targets/aoti/passes/attention_store.py): the partition
meta carries them, ``Program.run_in_place`` leaves them out only where the cache itself
went in on the GPU, and the cache write then leaves those buffers as the step left them.
On the CPU, with stand-ins for the library and the GPU tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from runtime.executors.aoti import AotiMeta
from runtime.generation.cache import KvCache
from runtime.generation.layout import CacheLayer, CacheLayout
from runtime.program.torch_program import Program, _in_place

NAMES = ["logits", "k_0", "v_0", "k_1", "v_1"]


def _library(stored=(1, 2, 3, 4)):
    """A one-partition GPU step's call and executor: every output, the stored ones too."""
    executor = SimpleNamespace(stored_outputs=stored)
    return executor, (lambda inputs: [f"out {name}" for name in NAMES])


def test_the_meta_names_stored_outputs_as_a_tuple_and_leaves_it_out_when_unset():
    raw = {"package": "partitions/p0/model.pt2", "stored_outputs": [1, 2, 3, 4]}
    meta = AotiMeta.from_json(raw, where="test")
    assert meta.stored_outputs == (1, 2, 3, 4) and meta.to_json() == raw
    assert "stored_outputs" not in AotiMeta.from_json({"package": "m.pt2"},
                                                      where="test").to_json()


def test_a_gpu_partition_that_stored_rows_runs_without_them():
    executor, call = _library()
    run, names, on_cpu = _in_place(SimpleNamespace(device="cuda"), call, executor, NAMES)
    assert names == ["logits"] and not on_cpu
    assert run([]) == ["out logits"]
    executor, call = _library(stored=(2, 4))  # some layers only
    run, names, _ = _in_place(SimpleNamespace(device="cuda"), call, executor, NAMES)
    assert names == ["logits", "k_0", "k_1"] and run([]) == ["out logits", "out k_0", "out k_1"]


def test_partitions_that_stored_nothing_give_every_output():
    executor, call = _library(stored=())
    assert _in_place(SimpleNamespace(device="cuda"), call, executor, NAMES) is None
    plain = SimpleNamespace()  # an executor without the attribute (onnx, tvm, ...)
    assert _in_place(SimpleNamespace(device="cuda"), call, plain, NAMES) is None
    assert _in_place(SimpleNamespace(device="cpu"), call, plain, NAMES) is None


def _program(fits: bool | None):
    """Program.run_in_place's state for a GPU step that stored rows, with a shape check
    that answers ``fits`` (None: the inputs do not fit; False: not all on the CPU)."""
    executor, call = _library()
    state = SimpleNamespace(
        _in_place=_in_place(SimpleNamespace(device="cuda"), call, executor, NAMES),
        _fast_check=lambda inputs: fits,
        run=lambda inputs: {name: f"out {name}" for name in NAMES})
    return lambda inputs: Program.run_in_place(state, inputs)


def test_run_in_place_leaves_the_rows_out_only_where_the_cache_itself_went_in():
    on_gpu = [SimpleNamespace(is_cuda=True) for _ in range(6)]
    assert list(_program(False)(on_gpu)) == ["logits"]
    # a CPU input would have been copied to the GPU: the rows landed in the copy
    mixed = [*on_gpu[:5], SimpleNamespace(is_cuda=False)]
    assert list(_program(False)(mixed)) == NAMES
    on_cpu = [SimpleNamespace(is_cuda=False) for _ in range(6)]
    assert list(_program(True)(on_cpu)) == NAMES  # all on the CPU: copied, as mixed
    assert list(_program(None)(on_gpu)) == NAMES  # the general path explains a misfit


def test_the_cache_write_leaves_buffers_whose_rows_the_step_stored():
    """Rows left out are not written (the step stored them), rows given still are, in
    buffers of one stack as in one of their own."""
    full = CacheLayer(slots=8, window=None, key_shape=(2, 4), value_shape=(2, 4))
    ring = CacheLayer(slots=4, window=4, key_shape=(2, 4), value_shape=(2, 4))
    cache = KvCache(CacheLayout(batch=1, dtype="float32", layers=(full, full, ring)), "cpu")
    before = {name: buffer.clone() for name, buffer in cache.buffers.items()}
    given = {"k_1": torch.ones(1, 2, 1, 4), "v_2": torch.full((1, 2, 1, 4), 2.0)}
    cache.write(torch.tensor([5]), {"logits": torch.zeros(1, 1, 9), **given})
    for name, buffer in cache.buffers.items():
        want = before[name].clone()
        new = given.get(name.removeprefix("past_"))
        if new is not None:
            want[:, :, 5 % buffer.shape[2]] = new[:, :, 0]
        assert torch.equal(buffer, want), name

"""The decode kernels as programmatic dependent launches inside a built library
(targets/aoti/kernels/dependent_launch.py): the launcher rewrite and the declared writes
on the CPU, and a compiled library's numbers, kernels and launches on a Hopper GPU."""

from __future__ import annotations

import re
from tests.targets.aoti.aoti_library import compile_library

import pytest
import torch

from targets.aoti.kernels import dependent_launch
from targets.aoti.kernels.dependent_launch import (PLAIN_ENV, SUFFIX, declare_writes,
                                                   with_dependent_launches)
from tests.targets.aoti.aoti_library import compile_library


def test_the_launcher_of_this_torch_is_rewritten_to_start_gdc_kernels_dependent():
    from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
    driver = CUDADeviceOpOverrides().kernel_driver()
    rewritten = with_dependent_launches(driver)
    assert rewritten is not None
    assert "static inline void launchKernelPlain(" in rewritten
    assert "static inline CUfunction loadKernelPlain(" in rewritten
    assert "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION" in rewritten
    assert f'"{SUFFIX}"' in rewritten and f'"{PLAIN_ENV}"' in rewritten
    assert with_dependent_launches("static inline void launchKernel(") is None


def test_a_kernel_that_declares_its_writes_is_taken_to_write_only_those(monkeypatch):
    """Inside the rewrite, torch's analysis answers the declared writes (every other
    kernel still gets torch's own analysis)."""
    import torch._higher_order_ops.triton_kernel_wrap as wrap

    class Kernel:  # stands for a JITFunction: the analysis reads only the attribute
        pass

    declared, undeclared = declare_writes(Kernel(), "out_ptr"), Kernel()
    kwargs = {"x_ptr": torch.zeros(2), "out_ptr": torch.zeros(2), "N": 2}
    seen = []
    for name in ("identify_mutated_tensors", "identify_accessed_tensors"):
        if hasattr(wrap, name):
            monkeypatch.setattr(wrap, name, lambda kernel, *a, **k: seen.append(kernel))
    with dependent_launch._declared_writes_answered() as answered:
        assert answered
        name = next(n for n in ("identify_accessed_tensors", "identify_mutated_tensors")
                    if hasattr(wrap, n))
        answer = getattr(wrap, name)(declared, kwargs, {})
        getattr(wrap, name)(undeclared, kwargs, {})
    writes = answer if isinstance(answer, list) else [d.name for d in
                                                      answer.read_writes.writes]
    assert writes == ["out_ptr"]
    assert seen == [undeclared]


def test_every_dependent_kernel_declares_its_writes_and_only_those_wait():
    pytest.importorskip("triton")
    from targets.aoti.kernels import (decode_attention, pipe_gemv_triton, split_gemv_triton,
                                      triton_kernels)
    kernels = {name: value for module in (triton_kernels, decode_attention, split_gemv_triton,
                                          pipe_gemv_triton)
               for name, value in vars(module).items() if name.endswith("_kernel") or
               name.endswith("_kernel" + SUFFIX)}
    assert len(kernels) == 14
    for name, kernel in kernels.items():
        declared = getattr(kernel, "edge_exporter_writes", None)
        assert (declared is not None) == name.endswith(SUFFIX), name
        if declared:
            assert set(declared) <= set(kernel.arg_names), name


@pytest.mark.cuda
def test_a_compiled_library_holds_only_the_dependent_kernels_and_starts_them_so(tmp_path):
    """Products and attention, each reading the one before's output, compiled by
    AOTInductor inside dependent_launches(): the library loads only our ``_gdc`` kernels
    (no copies of their arguments) and its launcher is the rewritten one. Its numbers are
    the build's validation gate's to check (a generating build runs it on every build)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    from targets.aoti.kernels import ops
    torch.manual_seed(7)
    cuda = dict(device="cuda", dtype=torch.float16)
    hidden, heads, kv_heads, dim, slots = 256, 4, 2, 64, 64

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Parameter(torch.randn(hidden + 2 * kv_heads * dim, hidden,
                                                      **cuda) * 0.05)
            self.o = torch.nn.Parameter(torch.randn(hidden, hidden, **cuda) * 0.05)
            self.up = torch.nn.Parameter(torch.randn(1024, hidden, **cuda) * 0.05)
            self.down = torch.nn.Parameter(torch.randn(hidden, 512, **cuda) * 0.05)
            self.norm = torch.nn.Parameter(torch.rand(hidden, **cuda) + 0.5)

        def forward(self, x, past_k, past_v, mask, counts):
            qkv = ops.row_gemv(x, self.qkv, None, self.norm, None, 1e-5, 0.0, 0)
            q = qkv[..., :hidden].view(1, heads, 1, dim)
            k = qkv[..., hidden:hidden + kv_heads * dim].view(1, kv_heads, 1, dim)
            v = qkv[..., hidden + kv_heads * dim:].view(1, kv_heads, 1, dim)
            # the cache read before the attention's wait, as the decode pass marks it,
            # and the blocks joined in the split kernel (counts given: no fill kernel)
            mixed = ops.decode_attention(q, past_k, k, past_v, v, mask, dim ** -0.5, True,
                                         counts)
            h = ops.row_gemv(mixed.view(1, 1, hidden), self.o, None, None, x, 1e-5, 0.0, 0)
            gated = ops.row_gemv(h, self.up, None, self.norm, None, 1e-5, 0.0, 1)
            return ops.row_gemv(gated, self.down, None, None, h, 1e-5, 0.0, 0)

    inputs = (torch.randn(1, 1, hidden, **cuda),
              *(torch.randn(1, kv_heads, slots, dim, **cuda) for _ in "kv"),
              torch.zeros(1, 1, 1, slots + 1, **cuda),
              torch.zeros(kv_heads, device="cuda", dtype=torch.int32))
    program = torch.export.export(Step().eval(), inputs)
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "s.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    # the gated product's dependent launch is the row loop (gemv_config)
    assert loaded == {"row_gemv_kernel_gdc", "row_loop_kernel_gdc", "attention_join_kernel_gdc"}
    assert "launchKernelPlain" in source and PLAIN_ENV in source

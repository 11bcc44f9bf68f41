"""Inductor's own kernels as dependent launches in cuda builds
(targets/aoti/dependent_kernels.py): which kernels qualify, the launch lines and launcher
they get, the waits Inductor is made to write, on the CPU; on a Hopper GPU, a compiled
library's launches (the device bench times and validates whole builds)."""

from __future__ import annotations

import pytest
import torch
from torch._inductor import config
from torch._inductor.utils import IndentedBuffer

from targets.aoti import dependent_kernels as dk
from targets.aoti.kernels.dependent_launch import PLAIN_ENV, with_dependent_launches
from tests.targets.aoti.aoti_library import compile_library

META = {"signature": {"in_ptr0": "*fp16", "out_ptr0": "*fp16", "xnumel": "i32",
                      "XBLOCK": "constexpr"}, "launch_pdl": True}
HEAD = """@triton_heuristics.pointwise(size_hints={'x': 1024}, filename=__file__)
@triton.jit
def triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 1024
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    x0 = xindex
"""
LOAD = "    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)\n"
WAIT = "    tl.extra.cuda.gdc_wait()\n"
TAIL = ("    tl.extra.cuda.gdc_launch_dependents()\n"
        "    tl.store(out_ptr0 + (x0), tmp0 + 1.0, None)\n")
NAME = "triton_poi_fused_add_0"


def test_a_kernel_that_waits_before_touching_memory_follows_the_protocol():
    assert dk.follows_protocol(HEAD + WAIT + LOAD + TAIL, NAME, META)


@pytest.mark.parametrize("source,meta,why", [
    (HEAD + LOAD + WAIT + TAIL, META, "loads before it waits"),
    (HEAD + "    if x0 < 4:\n    " + WAIT + LOAD + TAIL, META, "waits only in a branch"),
    (HEAD + "    p = tl.make_block_ptr(in_ptr0, [4], [1], [0], [4], [0])\n" + WAIT + LOAD,
     META, "names a pointer before it waits"),
    (HEAD + LOAD + TAIL, META, "never waits"),
    (HEAD + WAIT + LOAD + TAIL, {**META, "launch_pdl": False}, "compiled for plain launch"),
    (HEAD + WAIT + LOAD + TAIL, {"signature": META["signature"]}, "a template: no flag"),
    ("def other(in_ptr0):\n" + WAIT + LOAD, META, "not the kernel named"),
])
def test_a_kernel_without_the_protocol_keeps_a_plain_launch(source, meta, why):
    assert not dk.follows_protocol(source, NAME, meta), why


class _CallWrapper:  # the fields of DeferredTritonCallWrapper the rewrite reads
    def __init__(self, name: str, body: str) -> None:
        self.kernel_name, self.kernel_name_to_body = name, {name: body}


def _launch(self, prefix, wrapper, kernel_var_name, params):  # as AOTInductor writes it
    prefix.writeline("void* kernel_args_[] = {&var_0};")
    prefix.writeline(f"launchKernel({kernel_var_name}, grid_0, grid_1, grid_2, 4, 0, "
                     "kernel_args_, stream_);")


def test_only_kernels_that_follow_the_protocol_get_the_dependent_launch_line():
    generate = dk._launching_dependent(_launch)
    dk.launched.clear()
    prefix = IndentedBuffer()
    with config.patch({dk.SETTING: True}):
        generate(_CallWrapper(NAME, HEAD + WAIT + LOAD + TAIL), prefix, None,
                 f"kernels_.{NAME}", {"triton_meta": META})
        generate(_CallWrapper(NAME, HEAD + LOAD + TAIL), prefix, None, "kernels_.plain",
                 {"triton_meta": META})
    with config.patch({dk.SETTING: False}):
        generate(_CallWrapper(NAME, HEAD + WAIT + LOAD + TAIL), prefix, None,
                 "kernels_.off", {"triton_meta": META})
    lines = [line for line in prefix.getvalue().splitlines() if "grid_0" in line]
    assert lines[0].startswith(f"launchKernelDependent(kernels_.{NAME}, grid_0")
    assert lines[1].startswith("launchKernel(kernels_.plain,")
    assert lines[2].startswith("launchKernel(kernels_.off,")
    assert dk.launched == [NAME]


def test_the_launcher_gets_the_dependent_launch_once_and_only_with_the_setting():
    from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
    plain = CUDADeviceOpOverrides().kernel_driver()
    driver = dk._with_dependent_launcher(lambda self: plain)
    with config.patch({dk.SETTING: True}):
        rewritten = driver(None)
        assert "static inline void launchKernelDependent(" in rewritten
        assert "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION" in rewritten
        assert f'"{PLAIN_ENV}"' in rewritten
        # the decode kernels' rewrite came first: left as it is, not renamed twice
        once = with_dependent_launches(plain)
        assert dk._with_dependent_launcher(lambda self: once)(None) == once
    with config.patch({dk.SETTING: False}):
        assert driver(None) == plain


def test_inductor_is_told_of_no_previous_kernel_so_it_waits_before_every_access():
    from torch._inductor.virtualized import V

    class Graph:
        class scheduler:  # noqa: N801 - stands for the graph's Scheduler
            previous_node = "the kernel before"
    seen = []
    handle = dk._waiting_first(lambda self, buffer, *deps, consider_reads=False:
                               seen.append((V.graph.scheduler.previous_node, consider_reads)))
    with V.set_graph_handler(Graph()):
        handle(None, "buffer", "buf0", consider_reads=True)
        assert Graph.scheduler.previous_node == "the kernel before"
    assert seen == [(None, True)]


def test_the_setting_is_given_only_where_dependent_launches_run(monkeypatch):
    assert dk._patch_points() is not None, "this torch lacks a place the rewrite changes"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dk, "dependent_launch_here", lambda device: True)
    monkeypatch.delenv(PLAIN_ENV, raising=False)
    assert dk.inductor_settings() == {dk.SETTING: True}
    monkeypatch.setenv(PLAIN_ENV, "1")
    assert dk.inductor_settings() == {}
    monkeypatch.delenv(PLAIN_ENV)
    monkeypatch.setattr(dk, "dependent_launch_here", lambda device: False)
    assert dk.inductor_settings() == {}


@pytest.mark.cuda
def test_a_compiled_library_starts_only_its_waiting_inductor_kernels_dependent(tmp_path):
    """A convolution, GroupNorm, GELU and residual compiled as the cuda target does: its
    Inductor kernels start as dependent launches and each waits first; numbers are the
    build gate's to check."""
    import re
    if not dk.inductor_settings():
        pytest.skip("dependent launches need a Hopper GPU and a torch with the setting")
    from targets.aoti.kernels.dependent_launch import dependent_launches
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1),
                                torch.nn.GroupNorm(1, 32), torch.nn.GELU()).cuda().half().eval()
    program = torch.export.export(model, (torch.randn(1, 16, 28, 28, device="cuda").half(),))
    with config.patch(dk.inductor_settings()), dependent_launches(), dk.dependent_kernels():
        path, source = compile_library(program, tmp_path / "m.pt2")
    dependent = re.findall(r"launchKernelDependent\(kernels_\.(\w+)", source)
    plain = re.findall(r"\blaunchKernel\(kernels_\.(\w+)", source)
    assert dependent and set(dependent) == set(dk.launched)
    assert all(name.startswith("triton_") and "_tem_" not in name for name in dependent)
    assert not [name for name in plain if name.startswith(("triton_poi", "triton_per",
                                                            "triton_red"))]
    assert source.count(dk.WAIT) >= len(set(dependent))  # their sources, quoted in the library
    assert "static inline void launchKernelDependent(" in source

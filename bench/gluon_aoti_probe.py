"""Can a Gluon kernel (Triton's lower-level dialect: explicit layouts, shared memory, TMA,
mbarriers) travel inside an artifact as the library's Triton kernels do?

The library's decode kernels are ``torch.library.triton_op``s whose kernels AOTInductor
compiles into the package. A kernel written in Gluon would only be worth building if the
same path takes it. This probe asks, on a GPU, for two Gluon kernels — a plain one
(blocked layout loads and stores) and one that copies a tile into shared memory by TMA
from a host-made tensor descriptor, waiting on an mbarrier — at each step of that path:

1. launched directly;
2. called through a ``triton_op`` (``wrap_triton``) in eager mode;
3. ``torch.export`` + ``aoti_compile_and_package`` + ``aoti_load_package``, then run.

Each step prints ``ok`` (and the output matches the input's math) or the error's first
line; nothing is retried.

    python bench/gluon_aoti_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import traceback
from pathlib import Path

import torch

ROWS, COLS = 64, 128  # the TMA tile: 16 KB of fp16


def _kernels():
    """(scale kernel, TMA copy kernel): made on call, so that importing this module needs
    no Gluon."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    @gluon.jit
    def scale_kernel(x_ptr, y_ptr, n, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
        offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
        mask = offs < n
        gl.store(y_ptr + offs, gl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    @gluon.jit
    def tma_copy_kernel(desc, y_ptr, R: gl.constexpr, C: gl.constexpr):
        row = gl.program_id(0) * R
        tile = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [row, 0], bar, tile)
        mbarrier.wait(bar, phase=0)
        mbarrier.invalidate(bar)
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        values = tile.load(layout)
        rows = row + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, C, layout=gl.SliceLayout(0, layout))
        gl.store(y_ptr + rows[:, None] * C + cols[None, :], values)

    return scale_kernel, tma_copy_kernel


def _launch_scale(kernel, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    kernel[(triton_cdiv(x.numel(), 512),)](x, y, x.numel(), BLOCK=512, num_warps=4)
    return y


def _launch_tma(kernel, x: torch.Tensor) -> torch.Tensor:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout.get_default_for([ROWS, COLS], gl.float16)
    desc = TensorDescriptor.from_tensor(x, [ROWS, COLS], layout)
    y = torch.empty_like(x)
    kernel[(x.shape[0] // ROWS,)](desc, y, R=ROWS, C=COLS, num_warps=4)
    return y


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _ops(scale_kernel, tma_kernel):
    """The two kernels as triton_ops (a namespace of the probe's own)."""
    from torch.library import triton_op, wrap_triton

    @triton_op("gluon_probe::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return _launch_scale(wrap_triton(scale_kernel), x)

    @triton_op("gluon_probe::tma_copy", mutates_args=())
    def tma_copy(x: torch.Tensor) -> torch.Tensor:
        return _launch_tma(wrap_triton(tma_kernel), x)

    return scale, tma_copy


def _step(name: str, run, expected: torch.Tensor, report: list) -> None:
    try:
        got = run()
        torch.cuda.synchronize()
        same = torch.equal(got, expected)
        line = f"{name}: {'ok' if same else 'WRONG OUTPUT'}"
    except Exception as error:  # the probe's answer is the error itself
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        line = f"{name}: {type(error).__name__}: {first[:300]}"
        traceback.print_exc()
    print(line, flush=True)
    report.append(line)


def _through_aoti(op, x: torch.Tensor, folder: Path, name: str):
    class Model(torch.nn.Module):
        def forward(self, x):
            return op(x)

    program = torch.export.export(Model(), (x,))
    package = torch._inductor.aoti_compile_and_package(
        program, package_path=str(folder / f"{name}.pt2"))
    return torch._inductor.aoti_load_package(package)(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import triton
    print(f"torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    scale_kernel, tma_kernel = _kernels()
    x = torch.randn(4096, device="cuda", dtype=torch.float16)
    tile_x = torch.randn(4 * ROWS, COLS, device="cuda", dtype=torch.float16)
    report: list = []
    _step("scale, direct launch", lambda: _launch_scale(scale_kernel, x), x * 2, report)
    _step("tma copy, direct launch", lambda: _launch_tma(tma_kernel, tile_x), tile_x,
          report)
    scale, tma_copy = _ops(scale_kernel, tma_kernel)
    _step("scale, triton_op eager", lambda: scale(x), x * 2, report)
    _step("tma copy, triton_op eager", lambda: tma_copy(tile_x), tile_x, report)
    with tempfile.TemporaryDirectory() as folder:
        _step("scale, AOTInductor package",
              lambda: _through_aoti(scale, x, Path(folder), "scale"), x * 2, report)
        _step("tma copy, AOTInductor package",
              lambda: _through_aoti(tma_copy, tile_x, Path(folder), "tma_copy"),
              tile_x, report)
    if args.out:
        args.out.write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()

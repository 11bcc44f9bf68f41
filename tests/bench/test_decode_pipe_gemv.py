"""decode_chain_cuda.py's pipelined variants (bench/decode_pipe_gemv.py): a chain launch
takes the chain's folds, refuses what the kernel does not fold, and each variant changes
only its product; "down unrolled" is the library's choice without STAGES. The kernel's
own tests: tests/targets/aoti/test_pipe_gemv.py."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")


def _made(*size, seed, scale=1.0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)


def _close(got, want):
    error = (got.float() - want.float()).abs().max().item()
    assert error <= 2e-2 * max(1.0, want.float().abs().max().item()), error


def test_a_chain_launch_takes_the_chains_folds():
    """PipeLaunch as decode_chain_cuda.step calls it: ``fold`` holds the norm or the
    residual."""
    device = triton_device()
    from bench.decode_pipe_gemv import PipeLaunch
    from targets.aoti.kernels.reference import row_gemv
    x = _made(1, 1, 96, seed=9, device=device)
    weight = _made(40, 96, seed=10, scale=0.1, device=device)
    norm = _made(96, seed=11, scale=0.1, device=device) + 1.0
    launch = PipeLaunch((2, 32, 4, 32, 3, 2))
    _close(launch(x, weight, None, {"norm": norm}, False),
           row_gemv(x, weight, None, norm, None, 1e-5, 0.0, 0))
    _close(launch(x, weight, None, {"residual": x[..., :40]}, False),
           row_gemv(x, weight, None, None, x[..., :40], 1e-5, 0.0, 0))
    assert repr(launch) == "pipe(2, 32, 4, 32, 3, 2)"


def test_a_chain_launch_refuses_what_the_kernel_does_not_fold():
    from bench.decode_pipe_gemv import PipeLaunch
    with pytest.raises(ValueError, match="no gate"):
        PipeLaunch((4, 64, 4, 64, 3, 1))(None, None, None, {"act": 1}, False)
    with pytest.raises(ValueError, match="16-bit rows"):
        PipeLaunch((4, 64, 4, 64, 3, 1))(None, None, object(), {}, False)


def test_the_variants_change_only_their_product_and_fit_the_1b_shapes():
    from bench.decode_pipe_gemv import CHANGES, SHAPES, PipeLaunch, pipe_variants
    from targets.aoti.kernels.pipe_gemv_triton import check_config
    default = {"qkv": (4, 512, 4, 2048), "o": (2, 512, 4, 2048),
               "gate_up": (2, 512, 4, 2048, False, 5),
               "down": (4, 512, 4, 2048, False, 0, 0, 4)}
    found = pipe_variants(default)
    assert len(found) == len(CHANGES) + 1
    assert found["dependent + join + down unrolled"][1] == {**default,
                                                          "down": (4, 512, 4, 2048)}
    pdl, configs, cache_ahead, join = found["dependent + join + pipe down 4 rows 4 stages"]
    assert pdl and join and cache_ahead is None
    assert isinstance(configs["down"], PipeLaunch)
    assert {k: v for k, v in configs.items() if k != "down"} == {
        k: v for k, v in default.items() if k != "down"}
    for changes in CHANGES.values():
        for product, config in changes.items():
            check_config(config, SHAPES[product][1])

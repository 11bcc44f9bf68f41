"""decode_chain_cuda.py's variants that run each layer's o -> gate/up -> down as one
persistent kernel (targets/aoti/kernels/persistent_mlp.py) in place of three products:
its grid all resident, the products separated by grid-wide barriers, each program's next
weights loaded before it waits at one.

A configuration is persistent_mlp's: (programs a multiprocessor, warps, (BLOCK_N,
BLOCK_K, AHEAD) for o, gate/up and down). ``stages``: the products the kernel does not
do are left out of the chain (o alone, o + gate/up), to time each stage's share.
"""

from __future__ import annotations

import torch

HIDDEN = 2048

# name -> persistent_mlp configuration
CONFIGS = {
    "1/SM 8w 2048 ahead": (1, 8, (8, 512, 2048), (4, 512, 2048), (8, 512, 2048)),
    "1/SM 8w 512 ahead": (1, 8, (8, 512, 512), (4, 512, 512), (8, 512, 512)),
    "1/SM 16w": (1, 16, (16, 512, 2048), (8, 512, 2048), (16, 512, 2048)),
    "2/SM 8w": (2, 8, (8, 512, 2048), (4, 512, 2048), (8, 512, 2048)),
    "2/SM 4w": (2, 4, (4, 512, 2048), (2, 512, 2048), (4, 512, 2048)),
    "4/SM 4w": (4, 4, (4, 512, 1024), (2, 512, 1024), (4, 512, 1024)),
}


def persistent_step(config: tuple):
    """A replacement for a layer's o, gate/up and down launches: (attention's output, the
    layer's input, its weights, the norm's weight, pdl) -> the layer's output."""
    from targets.aoti.kernels.persistent_mlp import launch_persistent_mlp
    sync: dict = {}

    def mlp(att: torch.Tensor, h: torch.Tensor, layer: dict, norm: torch.Tensor,
            pdl: bool) -> torch.Tensor:
        if "buffer" not in sync:  # made on the first (uncaptured) call
            sync["buffer"] = torch.zeros(2, dtype=torch.int32, device=h.device)
        return launch_persistent_mlp(
            att, h, layer["o"][0], norm, layer["gate_up"][0], layer["down"][0],
            sync["buffer"], 1e-5, config=config, pdl=pdl)[1]
    return mlp


def persistent_variants(default: dict) -> dict:
    """decode_chain_cuda.variants' entries: "dependent + join" with the persistent MLP."""
    return {f"dependent + join + persistent MLP {name}":
            (True, default, None, True, None, None, persistent_step(config))
            for name, config in CONFIGS.items()}


def resources() -> dict:
    """Each compiled configuration's (programs a multiprocessor that fit, registers,
    spills), for the bench's printout."""
    from targets.aoti.kernels.persistent_mlp import persistent_resources
    return {f"{key[1]} programs, {dict(key[2]).get('num_warps')} warps, "
            f"{[v for k, v in key[2] if k.startswith(('BN', 'AHEAD'))]}": value
            for key, value in persistent_resources().items()}


def main() -> None:
    """Each configuration compiled for the chain's shapes and checked for residency:
    registers, spills, programs a multiprocessor (on the GPU machine)."""
    from targets.aoti.kernels.persistent_mlp import launch_persistent_mlp
    torch.manual_seed(0)
    inter = 5632

    def w(*size):
        return torch.randn(*size, device="cuda", dtype=torch.float16) * 0.02
    row = torch.randn(1, 1, HIDDEN, device="cuda", dtype=torch.float16)
    sync = torch.zeros(2, dtype=torch.int32, device="cuda")
    norm = torch.rand(HIDDEN, device="cuda", dtype=torch.float16) + 0.5
    weights = (w(HIDDEN, HIDDEN), norm, w(2 * inter, HIDDEN), w(HIDDEN, inter))
    for name, config in CONFIGS.items():
        try:  # the dependent form, as the chain launches it
            launch_persistent_mlp(row, row, *weights, sync, 1e-5, config=config, pdl=True)
        except ValueError as error:
            print(f"{name}: {error}", flush=True)
    torch.cuda.synchronize()
    for key, value in resources().items():
        print("resident a multiprocessor, registers, spills:", key, value, flush=True)


if __name__ == "__main__":
    main()

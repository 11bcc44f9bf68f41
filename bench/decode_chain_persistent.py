"""decode_chain_cuda.py's variants that run each layer's o -> gate/up -> down as one
persistent kernel (bench/persistent_mlp.py) in place of three products:
its grid all resident, the products separated by grid-wide barriers, each program's next
weights loaded before it waits at one.

A configuration is persistent_mlp's: (programs a multiprocessor, warps, (BLOCK_N,
BLOCK_K, AHEAD) for o, gate/up and down).

    python bench/decode_chain_persistent.py [NAME,NAME,...]

times each stage of the kernel (the wait for the kernel before, o, the first barrier,
gate/up, the second barrier, down) by its programs' GPU clock stamps over a chain of 22
kernels, and prints each configuration's registers and programs a multiprocessor.
The chain's variants: ``decode_chain_cuda.py --variants "dependent + join + persistent
MLP NAME"``.
"""

from __future__ import annotations

import sys

import torch

HIDDEN = 2048

# name -> persistent_mlp configuration
CONFIGS = {
    "1/SM 8w": (1, 8, (8, 512, 2048), (4, 512, 2048), (4, 512, 4096)),
    "1/SM 8w wide": (1, 8, (16, 512, 2048), (8, 512, 2048), (8, 512, 4096)),
    # whole turns for 128 programs: o and down one block, gate/up 11
    "1/SM 8w balanced": (1, 8, (16, 512, 2048), (4, 512, 2048), (16, 512, 2048)),
    "2/SM 8w": (2, 8, (8, 512, 2048), (4, 512, 2048), (4, 512, 4096)),
    "2/SM 8w balanced": (2, 8, (8, 512, 2048), (2, 512, 2048), (8, 512, 2048)),
    "4/SM 4w balanced": (4, 4, (4, 512, 2048), (1, 1024, 2048), (4, 512, 2048)),
}


def persistent_step(config: tuple):
    """A replacement for a layer's o, gate/up and down launches: (attention's output, the
    layer's input, its weights, the norm's weight, pdl) -> the layer's output."""
    from bench.persistent_mlp import launch_persistent_mlp
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
    from bench.persistent_mlp import persistent_resources
    return {f"{key[1]} programs, {dict(key[2]).get('num_warps')} warps, "
            f"{[v for k, v in key[2] if k.startswith(('BN', 'AHEAD'))]}": value
            for key, value in persistent_resources().items()}


def stage_times(config: tuple, layers: int = 22, runs: int = 5) -> dict:
    """us of each stage of the kernel, from its programs' clock stamps over a chain of
    ``layers`` kernels (each its own weights, dependent launches), the last of ``runs``:
    medians over layers of the programs' median (and the slowest program's) time."""
    from bench.persistent_mlp import launch_persistent_mlp, persistent_grid
    inter = 5632

    def w(*size):
        return torch.randn(*size, device="cuda", dtype=torch.float16) * 0.02
    made = [(w(HIDDEN, HIDDEN), w(2 * inter, HIDDEN), w(HIDDEN, inter))
            for _ in range(layers)]
    norm = torch.rand(HIDDEN, device="cuda", dtype=torch.float16) + 0.5
    row = torch.randn(1, 1, HIDDEN, device="cuda", dtype=torch.float16)
    sync = torch.zeros(2, dtype=torch.int32, device="cuda")
    programs = persistent_grid(row.device, config[0])
    stamps = torch.zeros(layers, programs * 8, dtype=torch.int64, device="cuda")
    for _ in range(runs):
        h = row
        for layer, (wo, wgu, wd) in enumerate(made):
            h = launch_persistent_mlp(row, h, wo, norm, wgu, wd, sync, 1e-5, config=config,
                                      pdl=True, stamps=stamps[layer])[1]
    torch.cuda.synchronize()
    at = stamps.view(layers, programs, 8)[..., :7].double() / 1000
    names = ["start to wait", "o", "barrier 1", "gate/up", "barrier 2", "down"]
    found = {}
    for i, name in enumerate(names):
        took = at[..., i + 1] - at[..., i]
        found[name] = (took.median(dim=1).values.median().item(),
                       took.max(dim=1).values.median().item())
    span = at[..., 6].max(dim=1).values - at[..., 0].min(dim=1).values
    found["first start to last end"] = (span.median().item(), span.median().item())
    return found


def main() -> None:
    """Each configuration's stages timed by clock stamps (on the GPU machine)."""
    torch.manual_seed(0)
    only = sys.argv[1].split(",") if len(sys.argv) > 1 else list(CONFIGS)
    for name in only:
        times = stage_times(CONFIGS[name])
        print(f"{name}: " + ", ".join(f"{stage} {median:.2f} (slowest {slowest:.2f})"
                                      for stage, (median, slowest) in times.items()),
              flush=True)
    for key, value in resources().items():
        print("resident a multiprocessor, registers, spills:", key, value, flush=True)


if __name__ == "__main__":
    main()

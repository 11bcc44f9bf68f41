"""decode_chain_cuda.py's chain variants under Nsight Compute: each named variant's graph
replayed once in the profiled range, so that its DRAM bytes and time read as one workload
(does a side branch's prefetch make the chain read more bytes?).

    ncu --graph-profiling graph --profile-from-start off ... \
        python bench/decode_chain_ncu.py --variants "A,B" [--layers 22]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_chain_cuda import step, variants, weights  # noqa: E402


def main() -> None:
    """Under Nsight Compute (``--graph-profiling graph --profile-from-start off``): each named
    variant's chain graph replayed once in the profiled range, so that its DRAM bytes and
    time are read as one workload (does the side branch read more bytes?)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", required=True, help="comma-separated variant names")
    parser.add_argument("--layers", type=int, default=22)
    args = parser.parse_args()
    torch.manual_seed(0)
    made = weights(args.layers, 512)
    hidden = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    chosen = variants()
    graphs = {}
    for label in args.variants.split(","):
        pdl, configs, *cache = chosen[label]
        ahead, join, block_s, hook = (*cache, None, False, None, None)[:4]
        step(made, hidden, pdl, configs, ahead, join, block_s, hook)
        torch.cuda.synchronize()
        graphs[label] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[label]):
            step(made, hidden, pdl, configs, ahead, join, block_s, hook)
        for _ in range(3):
            graphs[label].replay()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, graph in graphs.items():
        print(f"profiled: {label}", flush=True)
        graph.replay()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()

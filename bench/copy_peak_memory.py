"""Peak host memory of the build's copies of a model, old way against new, each in a
fresh process, rounds interleaved, medians:

    cast     ``copy.deepcopy(m).to(dtype)`` (the fp16/bf16 cast, the float64 reference)
             against ``converted_copy(m, dtype=...)`` (exporter/model/given_module.py)
    int8w    the int8-weight pass on the captured program, its module deep-copied
             against ``copy_sharing_weights`` (passes/quantize/quant_graph.py)

    python bench/copy_peak_memory.py --layers 60 --rounds 3

The figure is the resident set's growth (VmHWM reset after the model, and for int8w its
captured program, is made); the model is ``--layers`` Linear(2048, 2048) (60 layers:
252M parameters, 1.0 GB in float32).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {"deepcopy-fp16": ("deepcopy", "float16"), "converted-fp16": ("converted", "float16"),
            "deepcopy-fp64": ("deepcopy", "float64"), "converted-fp64": ("converted", "float64"),
            "deepcopy-int8w": ("deepcopy", "int8w"), "shared-int8w": ("shared", "int8w")}


def one(variant: str, layers: int) -> dict:
    import torch

    from runtime.memory.peak import _reset_high_water_mark, _status_bytes
    how, dtype = VARIANTS[variant]
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(layers)]).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    copy_of = _quantized if dtype == "int8w" else _cast
    made = copy_of(model, how, dtype, _reset_high_water_mark)
    grown = _status_bytes("VmHWM") - made
    return {"variant": variant, "weights_mb": round(weights / 1e6),
            "peak_growth_mb": round(grown / 1e6)}


def _cast(model, how: str, dtype: str, reset) -> int:
    import torch

    from exporter.model.given_module import converted_copy
    start, dtype = reset(), getattr(torch, dtype)
    made = (copy.deepcopy(model).to(dtype) if how == "deepcopy"
            else converted_copy(model, dtype=dtype))
    assert next(made.parameters()).dtype == dtype
    return start


def _quantized(model, how: str, _dtype: str, reset) -> int:
    import torch

    import passes.quantize.quantize_weight_only as weight_only
    if how == "deepcopy":  # the pass as it was
        weight_only.copy_sharing_weights = copy.deepcopy
    program = torch.export.export(model, (torch.randn(1, 2048),))
    start = reset()
    info = weight_only.QuantizeWeightOnly("int8-weight", "bench", "cpu")(program).info
    assert len(info["layers_quantized"]) == len(model)
    return start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--one", choices=VARIANTS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.layers)))
        return
    rows: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
    for _ in range(args.rounds):
        for variant in rows:
            out = subprocess.run([sys.executable, __file__, "--one", variant, "--layers",
                                  str(args.layers)], check=True, capture_output=True, text=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows[variant].append(row)
            print(json.dumps(row))
    for variant, runs in rows.items():
        print(f"{variant:16s} weights {runs[0]['weights_mb']} MB, peak growth median "
              f"{statistics.median(r['peak_growth_mb'] for r in runs)} MB "
              f"({', '.join(str(r['peak_growth_mb']) for r in runs)})")


if __name__ == "__main__":
    main()

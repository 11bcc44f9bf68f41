"""What each CPU engine's Python adds to a call of the same AOTInductor library: the
runtime's ``Program.run`` (its input check, the executor, the outputs by name) and
AOTInductor's own ``aoti_load_package`` wrapper (the peer of bench/cpu_choice.py: its
call spec parsed, pytree flatten and unflatten), each with the library call replaced by
a stub that hands back the outputs of one real call, so the figures are the Python alone.

    python bench/cpu_choice_overhead.py --model bench/models.py:bert_base \\
        --work-dir build/cpu-pinned    # bench/cpu_choice.py's files for that model
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_call_us(call, number: int = 2000, repeat: int = 7) -> float:
    """The fastest of ``repeat`` means: the Python's own cost, least disturbed."""
    return round(min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6, 2)


def runtime_overhead(artifact: Path, inputs: list) -> dict:
    """Program.run and its executor's call, with the library call stubbed."""
    import runtime

    program = runtime.load(str(artifact))
    executor = program.executors[0]
    if len(program.executors) != 1 or not hasattr(executor, "_run"):
        raise SystemExit(f"{artifact}: not one AOTInductor partition")
    outputs = executor._run(inputs)
    executor._run = lambda tensors: outputs  # read per call by the executor
    return {"program_run_us": per_call_us(lambda: program.run(inputs)),
            "executor_us": per_call_us(lambda: executor(inputs))}


def peer_overhead(package: Path, args: tuple, kwargs: dict, inputs: list) -> dict:
    """aoti_load_package's wrapper, its loader stubbed (the real loader's call spec)."""
    import torch
    from torch._inductor.package.package import AOTICompiledModel

    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
    outputs, spec = loader.boxed_run(list(inputs)), loader.get_call_spec()

    class Stub:
        def get_call_spec(self):
            return spec

        def boxed_run(self, tensors):
            return outputs

    peer = AOTICompiledModel(Stub())
    return {"peer_wrapper_us": per_call_us(lambda: peer(*args, **kwargs))}


def main() -> None:
    import torch

    from bench.compare_targets import _name, _spec
    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = load_spec(_spec(args.model))
    inputs = flatten_inputs(spec.args, spec.kwargs).tensors
    work, name = Path(args.work_dir), _name(args.model)
    with torch.inference_mode():
        row = {"model": name, **runtime_overhead(work / f"{name}-cpu.artifact", inputs),
               **peer_overhead(work / f"{name}-aoti-frozen.pt2", spec.args, spec.kwargs,
                               inputs)}
    print(json.dumps(row))


if __name__ == "__main__":
    main()

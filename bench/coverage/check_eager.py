"""Check that every coverage model runs eagerly, gives outputs a validation can judge, and
captures with torch.export.

Covers the models with needs="any" (and the torchvision/timm ones too where torchvision
is installed, as on the GPU machine).

    python bench/coverage/check_eager.py                # every model this machine can run
    python bench/coverage/check_eager.py bert llama     # only these
    python bench/coverage/check_eager.py --fast         # the fast slice

One line per model: name, ok/FAIL, parameter count, eager seconds, export seconds and
the first line of any error. An output that is NaN/inf, or so near a constant that a build
returning a constant would pass validation (unit_scale.spread_problems), fails its model.
Models are run one at a time on one CPU thread (the machine is shared); the exit status is
1 when any model failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository root: specs are relative to it
sys.path.insert(0, str(ROOT))

from bench.coverage.suite import Model, select  # noqa: E402
from bench.coverage.unit_scale import spread_problems  # noqa: E402


def load_factory(spec: str):
    """The factory a ``FILE.py:NAME`` spec names, its file imported by path with its folder
    on sys.path, as `exporter build` imports it (the factories import unit_scale.py)."""
    file, _, name = spec.rpartition(":")
    path = ROOT / file
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    module_name = f"_coverage_{path.stem}"
    module = sys.modules.get(module_name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    return getattr(module, name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def check(model: Model, verbose: bool = False) -> bool:
    params = eager_s = export_s = None
    stage = "factory"
    try:
        module, args, kwargs = load_factory(model.spec)()
        params = sum(p.numel() for p in module.parameters())
        stage = "eager"
        start = time.perf_counter()
        with torch.no_grad():
            out = module(*args, **kwargs)
        eager_s = time.perf_counter() - start
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        problems = spread_problems(leaves)
        if problems:
            raise ValueError(f"{len(problems)} degenerate output(s): {'; '.join(problems)}")
        stage = "export"
        start = time.perf_counter()
        torch.export.export(module, args, kwargs, strict=False)
        export_s = time.perf_counter() - start
        error = ""
    except Exception as exc:  # report and go on to the next model
        error = f"{stage}: {_first_line(exc)}"
        if verbose:
            traceback.print_exc()
    ok = not error
    fmt = lambda s: "-" if s is None else f"{s:.2f}s"  # noqa: E731
    print(f"{model.name:<24} {'ok' if ok else 'FAIL':<4} {model.family:<16} "
          f"{params if params is not None else '-':>9} params  eager {fmt(eager_s):>6}  "
          f"export {fmt(export_s):>7}  {error}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="model names (default: all)")
    parser.add_argument("--fast", action="store_true", help="only the fast slice")
    parser.add_argument("-v", action="store_true", help="print full tracebacks")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    has_torchvision = importlib.util.find_spec("torchvision") is not None
    models = select(opts.names or None, machine_has_torchvision=has_torchvision)
    if opts.fast:
        models = [m for m in models if m.fast]
    failed = [m.name for m in models if not check(m, opts.v)]
    print(f"{len(models) - len(failed)}/{len(models)} ok" +
          (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

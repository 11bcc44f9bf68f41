"""The cpu target's backend for each partition: AOTInductor or ONNX Runtime, whichever
runs it faster on this machine (``--cpu-backend auto``), or the one the user pins. Where
the partition's float32 linears are large, AOTInductor is built twice, their weights on
MKL's GEMM and packed for oneDNN's (``PACKED``), and timed as two candidates.

    the candidates this build can use, cheapest to build first -> each lowered in a folder
    of its own (one that fails is dropped, with why) -> those that built timed in a child
    process on the partition's example inputs (timing.py) -> the fastest kept

ONNX Runtime's candidate is the onnx target's own passes and lowering, run on a copy of
the partition (passes edit a program in place): the partition `--target onnx` would make.
A pinned backend's failure is the build's error; without a pin a candidate that fails is
dropped, and the build fails only when none built. ``Lowered.choice`` records what was
chosen, why, and each candidate's figures; the build puts it in the manifest.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import shutil
import time
import warnings
from typing import Callable

from torch.export import ExportedProgram

from passes.base import run_pipeline
from plan.partition import is_shape_node
from runtime.host import scratch
from targets.aoti import timing
from targets.aoti.card import CPU_BACKEND_ENV, CpuOptions, pinned_by_environment
from targets.base import Lowered, LowerOptions
from targets.errors import LoweringError, TargetOptionError, first_line

log = logging.getLogger(__name__)

Lowering = Callable[[ExportedProgram, LowerOptions], Lowered]
# AOTInductor with Inductor's own packing of float32 linears (oneDNN's, as a plain frozen
# AOTInductor build has them), where "aoti" keeps them on MKL (linear_packing.py): which
# is faster depends on the CPU (slower on an AVX2 EPYC, faster on an AVX-512 Xeon), so
# it is a candidate, built where the float32 linears do at least PACKED_MIN_MACS
# multiply-adds a call (about a millisecond on two cores: less cannot repay its compile)
PACKED = "aoti-onednn"
PACKED_MIN_MACS = 10**8
# PACKED runs from the runtime's aligned copies of its constants only: read where the
# library's own load puts them (as plain AOTInductor does) it was no faster on an AVX2
# EPYC or an AVX-512 Xeon, and as a candidate of its own it was kept by noise.
# a backend's name -> its executor kind
EXECUTOR = {"aoti": "aoti", PACKED: "aoti", "onnx": "onnxruntime"}
# An ONNX export takes seconds where Inductor's C++ compile takes a minute: the export
# first, so a build stopped early has spent little on the candidate it may not keep.
BUILD_ORDER = ("onnx", "aoti", PACKED)
OWN = "aoti"  # the target's own backend: kept when nothing was measured


def asked_for(options: LowerOptions) -> tuple[str, str | None]:
    """('auto' or the pinned backend, what pinned it)."""
    given = options.target_as(CpuOptions).cpu_backend
    if given is not None:
        return given, f"--cpu-backend {given}"
    from_environment = pinned_by_environment()
    if from_environment is not None:
        return from_environment, f"{CPU_BACKEND_ENV}={from_environment}"
    return "auto", None


def lower_chosen(program: ExportedProgram, options: LowerOptions,
                 lowerings: dict[str, Lowering]) -> Lowered:
    """The partition lowered by the backend asked for, or by each candidate and the
    fastest kept; ``lowerings``: each backend's lowering, by name."""
    asked, by = asked_for(options)
    barred = not_offered(options)
    if asked != "auto":
        if asked in barred:
            raise TargetOptionError(f"{by}: ONNX Runtime cannot run this build's partitions "
                                    f"({barred[asked]})", where="--cpu-backend",
                                    hint="leave --cpu-backend out (auto), or pin aoti")
        lowered = lowerings[asked](program, options)
        return _kept(lowered, asked, {"by": by})
    order = (OWN, *[n for n in BUILD_ORDER if n != OWN]) if options.deterministic \
        else BUILD_ORDER
    built, errors, not_built = {}, {}, {}
    dropped = {n: {"dropped": f"not a candidate: {why}"} for n, why in barred.items()}
    for name in [n for n in order if n not in barred and n in lowerings]:
        not_built[name] = _not_worth(name, built, barred)
        if not_built[name]:
            continue
        try:
            built[name] = _build(name, program, options, lowerings[name])
        except Exception as exc:  # noqa: BLE001 - a candidate's failure drops it, no more
            log.info("cpu backend %s failed on partition %s: %s", name, options.partition,
                     exc)
            errors[name] = exc
            dropped[name] = {"dropped": f"failed to build: {_said(exc)}"}
        if options.deterministic and built:
            break
    # none built: the target's own backend's error, as a pinned build would say it
    failure = None if built else errors.get(OWN) or next(iter(errors.values()))
    for exc in errors.values():
        if exc is not failure:
            _release(exc)
    if failure is not None:
        raise failure
    kept = _pick(built, dropped, program, options)
    skipped = {n: why for n, why in not_built.items() if why}
    return dataclasses.replace(kept, choice={**kept.choice, "not_built": skipped}) \
        if skipped else kept


def _not_worth(name: str, built: dict, barred: dict) -> str | None:
    """Why candidate ``name`` is not worth building after ``built``, or None."""
    if name != PACKED:
        return None
    if "onnx" in barred:  # a build the choice does not time (quantized, bf16, generation)
        return f"built only where the choice times onnx too, not here ({barred['onnx']})"
    if OWN not in built:
        return f"{OWN} did not build"
    macs = (built[OWN][0].choice or {}).get("float32_linear_macs", 0)
    if macs < PACKED_MIN_MACS:
        return (f"its float32 linears do {macs:.3g} multiply-adds a call, under "
                f"{PACKED_MIN_MACS:.0e}")
    return None


def not_offered(options: LowerOptions) -> dict[str, str]:
    """The backends this build cannot use, and why."""
    why = None
    if options.quantize:
        why = f"--quantize {options.quantize} is the cpu target's recipe, run by Inductor"
    elif options.dtype != "fp32":
        why = f"--dtype {options.dtype}: ONNX Runtime's CPU kernels are float32"
    elif options.shared_weights:
        why = "programs that share one copy of the weights (text generation)"
    else:
        from targets.onnx.card import onnx_here
        ok, reason = onnx_here()
        why = None if ok else f"not available here: {reason}"
    return {"onnx": why} if why else {}


def lower_as_onnx(program: ExportedProgram, options: LowerOptions) -> Lowered:
    """The onnx target's passes and lowering of (a copy of) the partition, with its own
    options at their defaults."""
    from targets.onnx.target import OnnxTarget  # not through the registry, which imports us
    onnx = OnnxTarget()
    options = dataclasses.replace(options, target=onnx.Options())
    with warnings.catch_warnings():  # torch's own deprecation inside copying tree specs
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        program = copy.deepcopy(program)
    passed, _ = run_pipeline(program, onnx.default_passes(options))
    refused = sorted({f"{node.target}: {support.reason}" for node in passed.graph.nodes
                      if node.op == "call_function" and not is_shape_node(node)
                      for support in [onnx.supports(node)] if not support.ok})
    if refused:
        raise LoweringError(f"{len(refused)} op kind(s) of the partition have no ONNX "
                            f"translation: {'; '.join(refused[:3])}", details=refused,
                            movable=False, hint="build with --cpu-backend aoti, or --target "
                                                "onnx, which runs such ops on the CPU fallback")
    return onnx.lower(passed, options)


def _build(name: str, program: ExportedProgram, options: LowerOptions,
           lowering: Lowering) -> tuple[Lowered, float]:
    folder = options.work_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    lowered = lowering(program, dataclasses.replace(options, work_dir=folder))
    return lowered, round(time.perf_counter() - start, 2)


def _pick(built: dict[str, tuple[Lowered, float]], dropped: dict[str, dict],
          program: ExportedProgram, options: LowerOptions) -> Lowered:
    """The fastest that built and ran right; without figures, the first that built (the
    target's own where it did)."""
    candidates = {name: {"backend": EXECUTOR[name], "build_s": seconds, **(low.choice or {})}
                  for name, (low, seconds) in built.items()}
    record: dict = {}
    if options.deterministic:
        record["by"] = "--deterministic: not timed, the first backend that built"
    elif len(built) == 1:
        record["by"] = "the only backend that built"
    else:
        try:
            found = timing.time_candidates(
                {n: (EXECUTOR[n], low) for n, (low, _) in built.items()}, program,
                options.work_dir / "timing")
        except Exception as exc:  # noqa: BLE001 - timing informs the choice, never fails it
            found = {"error": f"timing failed: {_said(exc)}"}
        record["threads"] = found.get("threads")
        for name, figures in found.get("candidates", {}).items():
            candidates[name].update(figures)
        record["by"] = ("measured" if any("median_ms" in c for c in candidates.values())
                        else f"not measured ({found.get('error') or 'no backend ran right'})")
    timed = {n: c["median_ms"] for n, c in candidates.items() if "median_ms" in c}
    if timed and all("round_share" in candidates[n] for n in timed):
        timed = {n: candidates[n]["round_share"] for n in timed}  # timing.round_shares
    usable = [n for n in built if "dropped" not in candidates[n]] or list(built)
    chosen = (min(timed, key=timed.get) if timed
              else OWN if OWN in usable else usable[0])
    for name in built:
        if name != chosen:  # its files go with the scratch folder; no need to hold them
            shutil.rmtree(options.work_dir / name, ignore_errors=True)
    record["candidates"] = {**candidates, **dropped}
    return _kept(built[chosen][0], chosen, record)


def _kept(lowered: Lowered, name: str, record: dict) -> Lowered:
    choice = {"chosen": name, "backend": EXECUTOR[name], **record}
    log.info("cpu backend of partition: %s (%s)", name, choice["by"])
    return dataclasses.replace(lowered, backend=EXECUTOR[name], choice=choice)


def _said(exc: BaseException) -> str:
    what = getattr(exc, "what", None) or str(exc)
    return f"{type(exc).__name__}: {first_line(str(what))[:300]}"


def _release(exc: BaseException) -> None:
    """Logs a dropped candidate's error kept for the user: the build went on without it."""
    for path in getattr(exc, "kept", ()):
        scratch.remove(path)

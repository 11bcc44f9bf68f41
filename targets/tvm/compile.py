"""One partition through TVM: import, schedule (or tune), compile, and find the ops a
failure comes from. Imported only when target ``tvm`` lowers (``tvm`` is optional)."""

from __future__ import annotations

import functools
import inspect
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import tvm
from safetensors.torch import save_file
from torch.export import ExportedProgram
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program
from tvm.support import cc

from passes.cleanup.decompose import leaves_as_is
from targets.errors import TargetOptionError
from targets.tvm import tune as tvm_tune
from targets.tvm.locate import ops_named_in
from targets.tvm.schedule import (
    TRANSFORM_PARAMS,
    default_rules,
    lower_pipeline,
    schedule,
    schedule_report,
)

# target options TVM types as lists: "-mattr=+neon,+v8.2a" is ["+neon", "+v8.2a"]
_LIST_OPTIONS = frozenset({"mattr", "keys", "libs", "cl-opt"})


@dataclass
class Compiled:
    executable: object
    params: list  # tvm runtime tensors, in the order main() takes them after the inputs
    schedules: dict
    tvm_version: str = tvm.__version__
    notes: list[str] = field(default_factory=list)

    @property
    def num_params(self) -> int:
        return len(self.params)

    def save(self, library: Path, params: Path, cross_compiler: str | None = None) -> None:
        # a cross build links with the platform's g++ (TVM's own default is the host's)
        fcompile = cc.cross_compiler(cross_compiler) if cross_compiler else None
        self.executable.export_library(str(library), fcompile=fcompile)
        # Zero-padded names keep the order in a sorted safetensors header.
        save_file({f"p{i:05d}": torch.from_numpy(p.numpy()).contiguous()
                   for i, p in enumerate(self.params)}, str(params))


def _decomposed_once(program: ExportedProgram) -> dict:
    """from_exported_program's arguments for a program the tvm target's passes already ran
    torch.export's default table over (passes/cleanup/decompose.py): the importer's own
    ``run_decompositions()`` traced it again into the same graph (1.1 CPU s of a small
    encoder's build, the import itself 0.01). An importer without the switch gets none."""
    if "run_ep_decomposition" not in inspect.signature(from_exported_program).parameters:
        return {}
    return {"run_ep_decomposition": not leaves_as_is(program, _default_table())}


@functools.cache
def _default_table():
    return torch.export.default_decompositions()


def compile_partition(program: ExportedProgram, target_string: str, tune: int, options,
                      *, error: Callable, cross: bool = False) -> Compiled:
    """``cross``: the target is another platform's, whose code this machine cannot run."""
    target = parse_target(target_string)
    try:
        mod = from_exported_program(program, keep_params_as_input=True,
                                    **_decomposed_once(program))
    except Exception as exc:  # TVM raises bare AssertionError / KeyError / TVMError on import
        raise error("import", exc, program, options, ops_named_in(str(exc), program)) from exc
    mod, params = relax.frontend.detach_params(mod)
    main_params = list(params.get("main", []))
    rule_counts: Counter = Counter()
    if tune > 0:
        try:
            scheduled, tuning = tvm_tune.tune(mod, target, tune, options.work_dir, rule_counts)
        except TargetOptionError:
            raise
        except Exception as exc:  # noqa: BLE001 - MetaSchedule's InternalErrors: name the step
            raise error("tune", exc, program, options, []) from exc
        how = (f"MetaSchedule, {tune} trials over {tuning['tuned_tasks']} static-shape "
               f"functions; dlight rules for the {tuning['dynamic_shape_tasks']} with "
               "dynamic shapes")
    else:
        scheduled = schedule(mod, target, default_rules(rule_counts))
        how = "dlight rules, untuned"
    schedules = {"how": how, "prim_funcs": schedule_report(scheduled),
                 "rules": dict(rule_counts), "libraries": _libraries()}
    notes = []
    if tune > 0:
        schedules["tuning"] = tuning
        if tuning["dynamic_shape_tasks"]:
            notes.append(f"--tune: {tuning['dynamic_shape_tasks']} of {tuning['tasks']} TVM "
                         "functions have dynamic shapes, which TVM 0.27's MetaSchedule cannot "
                         "tune; they keep the untuned schedules (build with static shapes to "
                         "tune them)")
    try:
        executable = tvm.compile(scheduled, target=target, relax_pipeline=lower_pipeline(target))
    except Exception as exc:  # noqa: BLE001 - TVM's InternalError and friends
        # names no op (``t.MatchesCode(kDLFloat)``), and PrimFunc names match ops only by
        # guess ('add' named every add): the build finds the op by lowering the partition's
        # prefixes (exporter/builder/isolate.py)
        raise error("compile", exc, program, options, []) from exc
    return Compiled(executable, run_transform_params(executable, scheduled, main_params,
                                                     cross=cross),
                    schedules, notes=notes)


def run_transform_params(executable, mod: tvm.IRModule, params: list, *,
                         cross: bool = False) -> list:
    """Run the lifted weight transforms once, here: the artifact stores their results.
    The build machine runs the library anyway (validation), so it can run this too; a
    cross build compiles them once more for this machine to run them."""
    if not any(g.name_hint == TRANSFORM_PARAMS for g in mod.get_global_vars()):
        return params
    if cross:
        host = tvm.target.Target("llvm")
        executable = tvm.compile(mod, target=host, relax_pipeline=lower_pipeline(host))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return list(vm[TRANSFORM_PARAMS](params))


def parse_target(target_string: str) -> tvm.target.Target:
    """A TVM target from JSON ('{"kind": "llvm", "mcpu": "znver4"}'), a kind ('llvm'), or
    the command-line form TVM itself dropped in 0.2x ('llvm -mcpu=znver4 -num-cores=4')."""
    text = target_string.strip()
    try:
        if text.startswith("{"):
            spec = json.loads(text)
        else:
            kind, *flags = text.split()
            spec = {"kind": kind}
            for flag in flags:
                key, _, value = flag.lstrip("-").partition("=")
                spec[key] = (value.split(",") if key in _LIST_OPTIONS else
                             int(value) if value.isdigit() else (value or True))
        target = tvm.target.Target(spec)
    except Exception as exc:  # noqa: BLE001 - json/TVM errors for a bad string
        raise TargetOptionError(f"TVM does not accept the target '{target_string}' "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                                where="--tvm-target",
                                hint='e.g. llvm, "llvm -mcpu=x86-64-v3" or '
                                     '\'{"kind": "llvm", "mcpu": "znver4"}\'') from exc
    if target.kind.name != "llvm":
        raise TargetOptionError(f"--tvm-target '{target_string}' is not a CPU (llvm) target",
                                where="--tvm-target",
                                hint="the runtime runs TVM partitions on the CPU (LLVM); for "
                                     "an NVIDIA GPU use --target cuda (AOTInductor)")
    return target


def _libraries() -> dict:
    """Which library offloads (BYOC) this TVM wheel was built with."""
    info = tvm.support.libinfo()
    return {key: info.get(key) for key in ("USE_DNNL", "USE_BLAS", "USE_MKL", "USE_OPENMP")
            if key in info}

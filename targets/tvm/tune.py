"""``--tune N``: MetaSchedule over a partition's static-shape PrimFuncs.

TVM 0.27's MetaSchedule cannot handle symbolic shapes: tuning a function with a
dynamic batch failed here inside its task scheduler (``parallel_for_dynamic error
... old_rv != nullptr``). So only functions whose buffers all have static shapes
are tuned; the rest, and any function MetaSchedule found nothing for, get the
untuned rules (targets/tvm/schedule.py), and the report says how many went which way.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections import Counter
from pathlib import Path

import tvm
from tvm import relax, tirx
from tvm.s_tir import dlight as dl

from targets.card import install_command
from targets.errors import TargetOptionError
from targets.tvm.schedule import TRANSFORM_PARAMS, default_rules, schedule


def tune(mod: tvm.IRModule, target: tvm.target.Target, trials: int, work_dir: Path,
         rule_counts: Counter) -> tuple[tvm.IRModule, dict]:
    """The scheduled module and a report: trials, functions tuned, functions left to rules."""
    missing = [m for m in ("psutil", "cloudpickle") if importlib.util.find_spec(m) is None]
    if missing:
        raise TargetOptionError(f"--tune needs {', '.join(missing)} (MetaSchedule's workers)",
                                hint=install_command("tvm"))
    from tvm.s_tir import meta_schedule as ms
    if "num-cores" not in target.attrs:  # MetaSchedule refuses a target without it
        target = tvm.target.Target({**dict(target.export()), "num-cores": _usable_cores()})
    legal = schedule(mod, target, rules=None)  # legalized, default loops: MetaSchedule's input
    # Tasks from main only: the lifted weight transforms run once, at build time.
    inference = tvm.IRModule({gv: f for gv, f in legal.functions_items()
                              if gv.name_hint != TRANSFORM_PARAMS})
    tasks = ms.relax_integration.extract_tasks(inference, target)
    static = [t for t in tasks if all(_static(m) for m in t.dispatched)]
    report = {"trials": trials, "tasks": len(tasks), "tuned_tasks": len(static),
              "dynamic_shape_tasks": len(tasks) - len(static),
              # xgboost is MetaSchedule's default cost model; without it, random search
              "cost_model": "xgb" if importlib.util.find_spec("xgboost") else "random"}
    if static:
        with tempfile.TemporaryDirectory(prefix="tvm-tune-", dir=work_dir) as tune_dir:
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                extracted_tasks=static, work_dir=tune_dir, seed=0)
            database = ms.tune.tune_tasks(
                tasks=contexts, task_weights=weights, work_dir=tune_dir,
                max_trials_global=trials, num_trials_per_iter=min(trials, 32),
                cost_model=report["cost_model"])
            with target, database:
                legal = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(legal)
    # Whatever MetaSchedule did not schedule (dynamic shapes, no valid record) gets the
    # untuned rules; ApplyDefaultSchedule skips functions already marked scheduled.
    with target:
        scheduled = dl.ApplyDefaultSchedule(*default_rules(rule_counts))(legal)
    return scheduled, report


def _static(mod: tvm.IRModule) -> bool:
    """Every buffer parameter has literal dims (TVM 0.27's PrimFunc params are buffers
    themselves, ``BufferType`` vars; a shape variable shows up as a symbolic dim)."""
    return all(isinstance(dim, tirx.IntImm)
               for _, func in mod.functions_items() if isinstance(func, tirx.PrimFunc)
               for param in func.params if type(param.ty).__name__ == "BufferType"
               for dim in param.shape)


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

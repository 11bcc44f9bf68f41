"""Where a failed validation's numbers part from eager (docs/architecture.md: "On a mismatch, bisect").

The built program is interpreted op by op on the failing case (eager's own value of every
tensor the partitions hand each other). Each partition of the staged artifact is then fed
eager's values of its inputs and its outputs are compared with eager's values of the same
tensors: the first partition whose outputs diverge is named, with its ops and their source
lines. Partitions judged alone cannot accumulate each other's rounding, so a partition
named here computes something else, not something slightly rounder.

When no partition diverges, the exported program itself is compared with the model run
eagerly: torch.export may have captured another code path (``is_exporting()`` branches,
Python state), which no backend can be blamed for.
"""

from __future__ import annotations

import logging
import operator
from pathlib import Path
from typing import Protocol

import torch
from torch.export import ExportedProgram

import runtime
from exporter.model.source_lines import source_line
from exporter.validation.gates import Tolerance, compare_output, nonfinite_text
from exporter.validation.inputs import Case
from passes.graph.ops import op_label
from plan.partition import node_values, value_names
from runtime.format.manifest import Manifest
from targets import for_backend

log = logging.getLogger(__name__)

# A partition fed exact inputs diverges when an output's max |error| exceeds this share of
# max(1, max |eager|): well above a backend's reordering of float sums (~1e-6 in fp32),
# well below a wrong op.
DIVERGES = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
MAX_OPS_LISTED = 8


class Bisector(Protocol):
    """What a build's validation calls on a miss its gate bisects: the failed record's
    first failing call, bisected to a partition (``bisect`` below), or None where it
    cannot be re-created or the bisect itself breaks (it helps read a failure and never
    replaces it). A plain build's is exporter/builder/plain.py's ``PlainBisect``, a
    generating build's exporter/lm/validate.py's ``GenerationBisect``."""

    def __call__(self, artifact: Path, manifest: Manifest, record: dict) -> dict | None:
        ...


def bisect(artifact: Path, manifest: Manifest, program: ExportedProgram, case: Case,
           eager_outputs: list[torch.Tensor], dtype: str, device: str,
           partition_programs: dict[str, ExportedProgram], entry: str | None = None) -> dict:
    """{"case", "partitions": [rows in run order], "first_divergent": name or None,
    "ops": [...of that partition], "inside": {...} where its target can look inside (the first value
    inside that diverges, or how many were compared), "capture": {...} when
    no partition diverged}. ``device``: where the program was captured (its weights live
    there); ``partition_programs``: each partition's own program, as lowered; ``entry``:
    a further entry point's program (a generating artifact's ``decode``), not the main one."""
    view = manifest.entry_points[entry] if entry else manifest  # signature, partitions, coverage
    inputs = [case.inputs[spec.name].to(device) for spec in view.signature.inputs]
    names = value_names(program, [s.name for s in view.signature.inputs],
                        [s.name for s in view.signature.outputs])
    values = {names[node]: value for node, value in node_values(program, inputs).items()
              if node in names and node.op != "output"}  # the output node may share a name
    loaded = runtime.load(artifact, cuda_graphs=False, arenas=False)
    executors = (loaded.entry_points[entry] if entry else loaded).executors
    limit = DIVERGES.get(dtype, DIVERGES["fp32"])
    rows = [_judge(partition, execute, values, limit)
            for partition, execute in zip(view.partitions, executors)]
    first = next((row["partition"] for row in rows if row["diverges"]), None)
    result: dict = {"case": case.name, "limit": limit, "partitions": rows,
                    "first_divergent": first}
    if first is not None:
        # an entry point's coverage names its partitions without the entry's prefix
        named = {first, first.removeprefix(f"{entry}_")} if entry else {first}
        result["ops"] = [{"node": c["node"], "op": c["op"], "source": c.get("source")}
                         for c in view.coverage if c.get("partition") in named]
        partition = next(p for p in view.partitions if p.name == first)
        sub_program = partition_programs.get(first)
        target = for_backend(partition.backend)
        if target is not None and sub_program is not None:
            try:
                result["inside"] = look_inside(
                    artifact, manifest, target, partition, sub_program,
                    [values[name] for name in partition.inputs], limit,
                    {c["node"]: c.get("source") for c in manifest.coverage})
            except Exception as exc:  # optional detail: the partition is already named
                log.warning("could not look inside partition %s (%s: %s)", first,
                            type(exc).__name__, exc)
    else:
        outputs = [values[spec.name] for spec in view.signature.outputs]
        result["capture"] = [_difference(spec.name, got, want.to(got.device), limit)
                             for spec, got, want in zip(view.signature.outputs, outputs,
                                                        eager_outputs)]
    return result


def look_inside(artifact: Path, manifest: Manifest, target, partition,
                sub_program: ExportedProgram, inputs: list[torch.Tensor], limit: float,
                sources: dict[str, str | None]) -> dict | None:
    """The first value inside a partition that parts from eager, as Polygraphy's "mark
    all" finds it: the target exposes what its backend computed for the nodes of the
    partition's own program (``Tooling.intermediate_values``), in its graph order, and
    each is compared with that program interpreted eagerly. A name whose shape or dtype
    differs from eager's is skipped, not blamed (a decomposition may reuse a name for
    another tensor). ``sources``: the build's source line per node of the whole program
    (the partition's program was traced again; its nodes name their origin). None where
    the target cannot look inside."""
    from runtime.format.archive import ArtifactReader

    nodes = {node.name: node for node in sub_program.graph.nodes if node.op == "call_function"}
    reference = {node.name: value for node, value in node_values(sub_program, inputs).items()
                 if node.name in nodes and isinstance(value, torch.Tensor)}
    from runtime.memory.shared_weights import SharedWeights

    names = partition.meta.get("shared_weights")
    with ArtifactReader.open(artifact) as reader:
        folder = reader.extract_private(partition.files)
        shared = (SharedWeights.from_manifest(manifest.shared_weights, reader, where=str(artifact))
                  .tensors(names, "cpu", partition=partition.name) if names else None)
        wanted = {name: value.dtype for name, value in reference.items()}
        produced = target.tooling.intermediate_values(folder, partition, wanted, inputs,
                                                      shared=shared, program=sub_program)
    if not produced:
        return None
    how = {"how": target.tooling.inside_how} if target.tooling.inside_how else {}
    for backend_op, name, value in produced:
        want = reference[name].cpu()
        if value.shape != want.shape or value.dtype != want.dtype:
            continue
        judged = _difference(name, value, want, limit)
        if judged["diverges"]:
            node = nodes[name]
            if node.target is operator.getitem:  # one output of a tuple: blame its op
                node = node.args[0]
            origin = (node.meta.get("from_node") or [None])[0]
            source = sources.get(getattr(origin, "name", None)) or source_line(node)
            return {"value": name, "backend_op": backend_op, "op": op_label(node.target),
                    "source": source, "compared": len(produced),
                    "backend": partition.backend, **how, **judged}
    return {"compared": len(produced), "diverges": False, "backend": partition.backend, **how}


def _judge(partition, execute, values: dict, limit: float) -> dict:
    row = {"partition": partition.name, "backend": partition.backend,
           "device": partition.device, "outputs": [], "diverges": False}
    missing = [name for name in partition.inputs if name not in values]
    if missing:  # not a tensor the interpreter names (should not happen): say so, go on
        row["skipped"] = f"no eager value for input(s) {', '.join(missing)}"
        return row
    try:
        got = execute([values[name].to(partition.device) for name in partition.inputs])
    except Exception as exc:  # a backend failing on eager's own inputs is a finding too
        row.update(diverges=True, problem=f"raised {type(exc).__name__}: {exc}"[:300])
        return row
    for name, tensor in zip(partition.outputs, got):
        judged = _difference(name, tensor, values[name].to(tensor.device), limit)
        row["outputs"].append(judged)
        row["diverges"] = row["diverges"] or judged["diverges"]
    return row


def _difference(name: str, got: torch.Tensor, want: torch.Tensor, limit: float) -> dict:
    """Validation's own comparison with eager as the reference and no allowance for eager's
    error: max |error| over finite elements <= limit x max(1, max |eager|), NaN/Inf
    positions equal, integers exact."""
    judged = compare_output(got, want, want, Tolerance(factor=0.0, floor=limit))
    judged.pop("abs_err_histogram", None)
    if "ratio_to_allowed" in judged:
        judged["relative"] = judged["ratio_to_allowed"] * limit
    return {"tensor": name, **judged, "diverges": not judged["passed"]}


def bisect_lines(result: dict) -> list[str]:
    """The result as the lines a failed build prints under its error."""
    lines = [f"bisect on case '{result['case']}', each partition fed eager's own values of "
             f"its inputs (diverges: error > {result['limit']:g} x max(1, |eager|), or NaN/Inf "
             "elsewhere, or any integer differs):"]
    for row in result["partitions"]:
        where = f"{row['partition']} ({row['backend']} @ {row['device']})"
        mark = " <- first to diverge" if row["partition"] == result["first_divergent"] else ""
        if "skipped" in row:
            verdict = f"not judged, {row['skipped']}"
        elif "problem" in row:
            verdict = row["problem"]
        else:
            verdict = ", ".join(_describe(o) for o in row["outputs"] if o["diverges"]) or "matches"
        lines.append(f"{where}: {verdict}{mark}")
    if result["first_divergent"] is not None:
        ops = result["ops"]
        first = result["first_divergent"]
        lines += [f"{first} runs {op['op']} ({op['node']}) at {op['source'] or 'unknown source'}"
                  for op in ops[:MAX_OPS_LISTED]]
        if len(ops) > MAX_OPS_LISTED:
            lines.append(f"{first} runs {len(ops) - MAX_OPS_LISTED} more op(s): "
                         "exporter inspect lists them")
        inside = result.get("inside")
        how = f" ({inside['how']})" if inside and inside.get("how") else ""
        if inside and not inside["diverges"]:
            lines.append(f"inside {first}, none of {inside['compared']} {inside['backend']} "
                         f"values compared with eager{how} diverges: the difference lies in "
                         "values the backend's graph does not name after the program's nodes")
        elif inside:
            lines.append(f"inside {first}, of {inside['compared']} {inside['backend']} values "
                         f"compared with eager{how}, the first to diverge is "
                         f"{_describe(inside)}: {inside['backend']} op {inside['backend_op']} "
                         f"from {inside['op']} at {inside['source'] or 'unknown source'}")
        return lines
    differs = [c for c in result["capture"] if c["diverges"]]
    if differs:
        lines.append("every partition matches the exported program, which itself differs "
                     "from the model run eagerly: " + ", ".join(_describe(c) for c in differs)
                     + ". torch.export captured another code path (an is_exporting() "
                     "branch, Python state, a global read at trace time)")
    else:
        lines.append("every partition matches eager given exact inputs, and so does the "
                     "exported program: the error builds up from rounding across partitions "
                     "or the inputs make the model sensitive to it; try representative "
                     "--inputs, or fewer partitions (--min-partition-size)")
    return lines


def _describe(judged: dict) -> str:
    name = judged["tensor"]
    if "problem" in judged:
        return f"'{name}' {judged['problem']}"
    if "mismatches" in judged:
        return f"'{name}' {judged['mismatches']} element(s) differ"
    text = f"'{name}' max error {judged['max_abs_err']:.3g} ({judged['relative']:.2g} relative)"
    return text if judged["nan_inf_positions_match"] else f"{text}, {nonfinite_text(judged)}"

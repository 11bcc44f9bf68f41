"""Readable summaries (rich) of a build result and of an artifact's manifest."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from exporter.report.backend_choice import choice_lines
# model_line and validation_lines: the report and the CLI import them from here too
from exporter.report.summary_lines import model_line, validation_lines  # noqa: F401
from runtime.format.manifest import Manifest
from targets.fallback import FALLBACK_BACKEND
from targets.registry import card_for_backend


def _signature_table(manifest: Manifest) -> Table:
    table = Table(title="signature", show_edge=False)
    table.add_column("kind")
    table.add_column("name")
    table.add_column("dtype")
    table.add_column("shape")
    for kind, specs in (("input", manifest.signature.inputs),
                        ("output", manifest.signature.outputs)):
        for spec in specs:
            table.add_row(kind, spec.name, spec.dtype,
                          "[" + ", ".join(d.describe() for d in spec.shape) + "]")
    return table


def print_placement(console: Console, coverage: list[dict], summary: dict) -> None:
    """Per op kind: where it runs and why; then each op that falls back, with its source line."""
    grouped = Counter((row["op"], row["backend"], row["device"], row["reason"])
                      for row in coverage)
    table = Table(title=f"op placement ({len(coverage)} ops)", show_edge=False)
    for column in ("op", "backend", "device", "count", "why"):
        table.add_column(column)
    for (op, backend, device, reason), count in sorted(grouped.items()):
        table.add_row(op, backend, device, str(count), reason)
    console.print(table)
    for row in coverage:
        if row["backend"] == FALLBACK_BACKEND:
            console.print(f"  fallback: {row['node']} {row['op']} in {row['partition']}"
                          + (f" at {row['source']}" if row.get("source") else ""),
                          markup=False, highlight=False)
    if summary:
        console.print(f"partitions: {summary.get('partitions')} "
                      f"({summary.get('delegated_partitions')} delegated, "
                      f"{summary.get('fallback_partitions')} CPU fallback); device transfers: "
                      f"{summary.get('device_transfers')}; ops by backend: "
                      f"{_pairs(summary.get('by_backend') or {})}", markup=False,
                      highlight=False)


def _pairs(values: dict) -> str:
    """{'onnxruntime@cpu': 5, 'torch@cpu': 1} as "onnxruntime@cpu 5, torch@cpu 1"."""
    return ", ".join(f"{key} {value}" for key, value in values.items())


def print_build(console: Console, result, verbose: bool = False) -> None:
    """What was built, in one line per stage's result; ``verbose``: every term."""
    manifest: Manifest = result.manifest
    size = Path(result.artifact).stat().st_size
    console.print(f"[bold]built[/bold] {result.artifact} ({file_size(size)}) "
                  f"for target [bold]{manifest.target}[/bold], platform "
                  f"{manifest.requirements.platform_name}")
    console.print(loads_on_line(manifest), markup=False, highlight=False)
    for line in [model_line(manifest.source), *choice_lines(manifest.build)]:
        if line:
            console.print(line, markup=False, highlight=False)
    console.print(_signature_table(manifest))
    measured = result.measured.get("memory")
    memory = (memory_lines(manifest, measured) if verbose
              else memory_summary(manifest, measured))
    for line in [*quantization_lines(manifest), *memory]:
        console.print(line, markup=False, highlight=False)
    for line in validation_lines(manifest.validation, verbose):
        console.print(line)


def printable(value):
    """``value`` (a manifest's JSON) with every control character shown as an escape:
    a hostile manifest must not send terminal escape sequences (cursor moves, title
    changes, hyperlinks) to the terminal of the user who inspects it."""
    if isinstance(value, str):
        return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), value)
    if isinstance(value, list):
        return [printable(v) for v in value]
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    return value


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def print_manifest(console: Console, manifest: Manifest, path: str,
                   verbose: bool = False) -> None:
    """``manifest`` should come from ``printable(raw)``: it is shown to a terminal.
    ``verbose``: the passes that changed nothing and the validation policy too."""
    console.print(f"[bold]{escape(path)}[/bold]: target {escape(manifest.target)}, built by "
                  f"{escape(str(manifest.created_by.get('toolchain')))} with torch "
                  f"{escape(str(manifest.created_by.get('torch')))} from "
                  f"{escape(str(manifest.source.get('spec')))}")
    line = model_line(manifest.source)
    if line:
        console.print(line, markup=False, highlight=False)
    console.print(built_for_line(manifest), markup=False, highlight=False)
    console.print(loads_on_line(manifest), markup=False, highlight=False)
    for line in choice_lines(manifest.build):
        console.print(line, markup=False, highlight=False)
    console.print(_signature_table(manifest))
    parts = Table(title="partitions", show_edge=False)
    for column in ("name", "backend", "device", "inputs", "outputs", "files"):
        parts.add_column(column)
    for p in manifest.partitions:
        parts.add_row(p.name, p.backend, p.device, ", ".join(p.inputs), ", ".join(p.outputs),
                      ", ".join(p.files))
    console.print(parts)
    print_placement(console, manifest.coverage, manifest.placement)
    for line in inside_lines(manifest):
        console.print(line, markup=False, highlight=False)
    idle = [r["name"] for r in manifest.passes if not r["modified"]]
    for record in manifest.passes if verbose else [r for r in manifest.passes if r["modified"]]:
        changed = "changed the graph" if record["modified"] else "no change"
        info = (_pairs({k: v for k, v in record["info"].items()  # lists: quantization_lines
                        if not isinstance(v, (list, dict))})
                if isinstance(record.get("info"), dict) else "")
        console.print(f"pass {record['name']}: {changed}" + (f" ({info})" if info else ""),
                      markup=False, highlight=False)
    if idle and not verbose:
        console.print(f"{len(idle)} more pass(es) ran and changed nothing (--verbose lists "
                      "them)", markup=False, highlight=False)
    for line in [*quantization_lines(manifest), *memory_lines(manifest)]:
        console.print(line, markup=False, highlight=False)
    for line in validation_lines(manifest.validation, verbose):
        console.print(line)


def built_for_line(manifest: Manifest) -> str:
    """The platform and whether the runtime needs torch: only where a partition (or a
    dtype) does; an ONNX or TVM artifact runs on numpy arrays without it."""
    from runtime.program.requires import torch_reasons
    facts = manifest.requirements.describe()
    if torch_reasons(manifest):
        return "built for: " + ", ".join(facts)
    rest = [fact for fact in facts if not fact.startswith("torch ")]
    return ("built for: " + ", ".join(rest) + "; runs without torch, on numpy arrays (built "
            f"with torch {manifest.requirements.torch}; takes torch tensors where it is "
            "installed)")


def loads_on_line(manifest: Manifest) -> str:
    """Where it loads, in one line: any platform (no native code), or the platform and
    the CPU instruction set its native code needs."""
    from runtime.program.requires import loads_on
    where = loads_on(manifest)
    if where["any_platform"]:
        return ("loads on any platform its runtime runs on (no native code: "
                f"{', '.join(where['platforms'])} ...)")
    line = f"requires {where['platforms'][0]}"
    if where["cpu_isa"]:
        line += (f" with {where['cpu_isa'].replace('+', ', ')} ({len(where['cpu_flags'])} "
                 "CPU flags; --cpu-isa to choose)")
    if where["cuda_capability"]:
        line += f", CUDA capability >= {where['cuda_capability']}"
    return line + f": native code ({', '.join(where['native_code'])})"


def inside_lines(manifest: Manifest) -> list[str]:
    """Where a backend placed each op inside its partitions (ExecuTorch: its XNNPACK
    delegates or its own kernels), as the backend said at lowering."""
    lines = []
    for partition in manifest.partitions:
        card = card_for_backend(partition.backend)
        lines += card.placement_lines(partition) if card else []
    return lines


def memory_lines(manifest: Manifest, measured: dict | None = None) -> list[str]:
    """The activation plan against its two yardsticks, the arenas the runtime allocates,
    and (just after a build) the peak measured while validating."""
    plan = manifest.memory_plan
    if not plan:
        return []
    bound = plan["lower_bound_bytes"] or 1
    lines = [f"memory plan (activations, at {plan.get('sized_at', 'the example shapes')}): "
             f"arena {_mb(plan['arena_bytes'])} = {plan['arena_bytes'] / bound:.3f}x the lower "
             f"bound {_mb(plan['lower_bound_bytes'])}; without reuse {_mb(plan['naive_bytes'])} "
             f"({plan['buffers']} buffers)"]
    for device, arena in (plan.get("arenas") or {}).items():
        handoffs = sum(key.startswith("handoff/") for key in arena["slots"])
        lines.append(f"  runtime arena on {device}: {_mb(arena['arena_bytes'])} preallocated for "
                     f"{len(arena['slots']) - handoffs} CPU-fallback tensor(s) and {handoffs} "
                     f"hand-off(s) between devices (lower bound {_mb(arena['lower_bound_bytes'])})")
    for partition in manifest.partitions:  # what a backend plans itself (ExecuTorch)
        card = card_for_backend(partition.backend)
        lines += [f"  {line}" for line in (card.memory_lines(partition) if card else [])]
    measured = measured or {}
    for device in [key.removesuffix("_peak_bytes") for key in measured
                   if key.endswith("_peak_bytes")]:
        lines.append(f"  measured on {device} while validating: "
                     f"{_mb(measured[f'{device}_peak_bytes'])} ({measured[f'{device}_how']}; "
                     "backends' workspaces and outputs included)")
    return lines


def memory_summary(manifest: Manifest, measured: dict | None = None) -> list[str]:
    """memory_lines in one line: the planned activations and the peak measured."""
    plan = manifest.memory_plan
    if not plan:
        return []
    peaks = [f"{_mb(v)} measured on {k.removesuffix('_peak_bytes')} while validating"
             for k, v in (measured or {}).items() if k.endswith("_peak_bytes")]
    return [f"memory: activations {_mb(plan['arena_bytes'])} planned (at "
            f"{plan.get('sized_at', 'the example shapes')})" + "".join(f"; {p}" for p in peaks)
            + " (--verbose: the plan's terms)"]


def _mb(size: int) -> str:
    return f"{size / 1e6:.3f} MB"


def file_size(size: int) -> str:
    """A file's size as people read it: ``2.9 kB`` (a small model read "0.00 MB"), ``1.65 MB``."""
    return f"{size / 1e3:.1f} kB" if size < 1e6 else f"{size / 1e6:.2f} MB"


def quantization_lines(manifest: Manifest) -> list[str]:
    """Recipe, layers quantized and left in float (with why), weight bytes before/after;
    per entry point where there are several (each quantizes its own graph)."""
    lines = []
    programs = programs_quantized(manifest)
    for name, info in programs:
        before, after = info["weight_bytes_before"], info["weight_bytes_after"]
        lines.append(f"quantized {info['recipe']} ({info['how']})"
                     + (f" [{name}]" if len({n for n, _ in programs}) > 1 else "") + ": "
                     f"{len(info['layers_quantized'])} layer(s) quantized, "
                     f"{len(info['layers_float'])} left in float; weights "
                     f"{before / 1e6:.2f} MB -> {after / 1e6:.2f} MB "
                     f"({before / max(after, 1):.1f}x smaller)")
        lines += [f"  left in float: {row['layer']} ({row['op']}): {row['why']}"
                  for row in info["layers_float"]]
        rows = info.get("layer_errors") or []
        measured = [r for r in rows if r.get("sqnr_db") is not None]
        if measured:  # null SQNR: the layer's output came out exact (infinite SQNR)
            worst = min(measured, key=lambda r: r["sqnr_db"])
            exact = len(rows) - len(measured)
            lines.append(f"  per-layer error on {info.get('layer_errors_on')}: worst "
                         f"{worst['layer']} at SQNR {worst['sqnr_db']:.1f} dB (cosine "
                         f"{worst['cosine']:.5f}) of {len(rows)} layer(s)"
                         + (f", {exact} of them exact on these inputs" if exact else ""))
    left = fallback_float_weights(manifest) if programs else None
    if left:
        lines.append(f"  left in float on the CPU fallback: {left['tensors']} weight tensor(s), "
                     f"{left['bytes'] / 1e6:.2f} MB ({left['ops']}): --quantize reaches only the "
                     "target's partitions")
    entries = len({name for name, _ in programs})
    if entries > 1 and not _target_partitions_share(manifest):  # aoti/base.py shares_weights
        total = sum(info["weight_bytes_after"] for _, info in programs)
        lines.append(f"each of the {entries} entry points holds its own quantized weights "
                     "(packed into its library for the int8 kernels, not shared): about "
                     f"{total / 1e6:.2f} MB in the file, which can be more than the float build")
    return lines


def _all_partitions(manifest: Manifest) -> list:
    return [*manifest.partitions, *(p for entry in (manifest.entry_points or {}).values()
                                    for p in entry.partitions)]


def _target_partitions_share(manifest: Manifest) -> bool:
    """Whether the target's own partitions read the shared store (the CPU fallback's
    always do in a generating build, so the store alone does not say)."""
    return any(p.backend != FALLBACK_BACKEND and p.meta.get("shared_weights")
               for p in _all_partitions(manifest))


_FLOATS = {"F32", "F16", "BF16", "F64"}
_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


def fallback_float_weights(manifest: Manifest) -> dict | None:
    """The float weight matrices (2-D and up) the CPU-fallback partitions read, each
    tensor once (entry points share the store's copies), and the custom ops there (an
    MoE's experts: transformers::grouped_mm_fallback): what --quantize did not reach."""
    store = {key: spec for index in ((manifest.shared_weights or {}).get("entries") or {}).values()
             for key, spec in index.items()}
    tensors, ops = {}, set()
    for partition in _all_partitions(manifest):
        if partition.backend != FALLBACK_BACKEND:
            continue
        specs = {key: store.get(key) for key in (partition.meta.get("shared_weights") or {}).values()}
        for index in (partition.meta.get("tensor_index") or {}).values():
            specs.update({f"{partition.name}/{name}": spec for name, spec in index.items()})
        # weights: float, 2-D and up; a quantized tensor's scales (a dim of 1) are not
        found = {key: spec for key, spec in specs.items()
                 if spec and spec[0] in _FLOATS and len(spec[1]) >= 2 and 1 not in spec[1]}
        tensors.update(found)
        if found:
            ops.update(op.replace(".", "::", 1) for op in partition.meta.get("custom_ops") or ())
    if not tensors:
        return None
    size = sum(_BYTES[dtype] * math.prod(shape) for dtype, shape in tensors.values())
    return {"tensors": len(tensors), "bytes": size,
            "ops": ", ".join(sorted(ops)) or "ops no target claims"}


def programs_quantized(manifest: Manifest) -> list[tuple[str, dict]]:
    """(program, record) for the main program ("main", or "prefill" in a generating
    artifact) and each entry point that quantized."""
    main = "prefill" if manifest.entry_points else "main"
    found = [(main, info) for info in quantization_records(manifest)]
    for name, entry in (manifest.entry_points or {}).items():
        found += [(name, info) for info in _records(entry.passes, entry.partitions)]
    return found


def float_layer_notes(manifest: Manifest) -> list[str]:
    """A recipe that left layers in float, as a warning (--json's ``warnings`` too, not
    only the text summary): 9 of 10 layers in float made an int4 build 1.2x smaller."""
    notes = []
    left = fallback_float_weights(manifest) if quantization_records(manifest) else None
    if left:
        notes.append(f"--quantize left {left['tensors']} weight tensor(s) ({left['bytes'] / 1e6:.2f}"
                     f" MB) in float on the CPU fallback ({left['ops']}), where it does not reach")
    for info in quantization_records(manifest):
        left, done = info.get("layers_float") or [], info.get("layers_quantized") or []
        if left:
            before, after = info["weight_bytes_before"], info["weight_bytes_after"]
            why = Counter(row["why"] for row in left).most_common(1)[0][0]
            notes.append(f"--quantize {info['recipe']} left {len(left)} of {len(left) + len(done)}"
                         f" weighted layer(s) in float (e.g. {why}); weights "
                         f"{before / max(after, 1):.1f}x smaller")
    return notes


def quantization_records(manifest: Manifest) -> list[dict]:
    """What --quantize did: the PT2E pass's record or, where the backend's own tools
    quantized (in the lowering), each partition's."""
    return _records(manifest.passes, manifest.partitions)


def _records(passes: list[dict], partitions: list) -> list[dict]:
    # the experts' pass records only where there were experts (passes/quantize/quantize_experts.py)
    records = [r["info"] for r in passes if r["name"] == "quantize"
               or r["name"] == "quantize_experts" and r.get("info")]
    return records + _merged([p.meta["quantization"] for p in partitions
                              if "quantization" in p.meta])


def _merged(records: list[dict]) -> list[dict]:
    """One program's partitions quantized apart (an MoE's layers between fallback calls:
    ten partitions): one record, their layers and bytes summed."""
    if len(records) < 2:
        return records
    merged = dict(records[0])
    for key in ("layers_quantized", "layers_float", "layer_errors"):
        merged[key] = [row for r in records for row in (r.get(key) or [])]
    for key in ("weight_bytes_before", "weight_bytes_after"):
        merged[key] = sum(r[key] for r in records)
    return [merged]

"""Target ``onnx``: each partition becomes one ONNX model that ONNX Runtime runs.

Op support is read from torch.onnx's own dynamo exporter: its registry of ATen ->
ONNX translations (torchlib) and the decomposition table it runs before
translating. Asking the exporter's tables, not a hand-written list, keeps
``supports`` in step with what ``torch.onnx.export`` will actually do.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time
from pathlib import Path

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from passes.base import Pass
from passes.cleanup.decompose import Decompose
from passes.graph.ops import is_custom_op
from runtime.executors.onnxruntime import OnnxRuntimeMeta
from runtime.format.manifest import Requirements
from runtime.host import scratch
from runtime.program.flat_inputs import flatten_inputs
from targets.card import install_command
from targets.base import (
    Availability,
    Lowered,
    LowerOptions,
    Support,
    Target,
    base_requirements,
    pipeline,
)
from targets.errors import LoweringError, TargetOptionError
from targets.facets import Generation, Partitioning, Quantization
from targets.fusion import GRAPH_FUSIONS
from targets.onnx import contrib_ops, inside, torch_onnx, variance
from targets.onnx import kernels as own_kernels
from targets.onnx.facets import OnnxPackaging, OnnxTooling
from targets.onnx.initializers import external_files
from targets.onnx.shared import externalize
from targets.onnx.packed_attention import pack_attention_inputs
from targets.onnx.passes.cast_before_rsub import CastBeforeRsub
from targets.onnx.passes.contiguous_views import ContiguousBeforeReshape
from targets.onnx.passes.rsqrt_as_division import RsqrtAsDivision
from targets.onnx.providers import refuse_bf16_on_cpu_only
from targets.onnx.stored_rows import store_new_rows
from targets.onnx.torch_onnx import (decomposition_table, exact_no_op_rules, new_report_dir,
                                     quiet_registry, without_input_guards)
from targets.onnx.card import ONNX, RECIPES, OnnxOptions, missing_packages, onnx_here
from targets.onnx.quantize import quantize_model
from targets.onnx.rotary import fuse_rotary_embeddings
from targets.onnx.skip_norm import fuse_skip_rms_norms
from targets.options import FallbackPolicy

log = logging.getLogger(__name__)

MODEL_NAME = "model.onnx"
# Weights go to a side file only past this size: one self-contained .onnx is simpler to
# ship and hash, and protobuf itself cannot hold more than 2 GB.
EXTERNAL_DATA_BYTES = 1 << 30
# Runtime checks that torch.onnx drops before translating (its
# _fx_passes.remove_assertion_nodes); they never reach ONNX, so they cost nothing.
_DROPPED_CHECKS = {
    "aten::sym_constrain_range_for_size", "aten::_assert_async", "aten::_assert_async.msg",
    "aten::_assert_scalar", "aten::_assert_tensor_metadata",
}


_missing_packages = functools.cache(missing_packages)  # asked once per node by supports()


@functools.cache
def _exporter_tables():
    """The exporter's registry and pre-translation decomposition table, built the way
    torch.onnx builds them (_compat.export_compat, _fx_passes.decompose_with_registry).
    Built once: the registry takes about a second."""
    from torch.onnx._internal.exporter import _registration
    with quiet_registry():
        registry = _registration.ONNXRegistry.from_torchlib()
    table = decomposition_table(registry)[1]
    return registry, {**table, **variance.decompositions()}  # its var/std leave a prims view


def _has_complex_input(node: Node) -> bool:
    """Like the exporter's dispatcher: complex inputs need a complex-aware translation."""
    def is_complex(arg) -> bool:
        if isinstance(arg, (list, tuple)):
            return any(is_complex(a) for a in arg)
        val = arg.meta.get("val") if isinstance(arg, Node) else None
        return isinstance(val, torch.Tensor) and val.is_complex()
    return any(is_complex(a) for a in (*node.args, *node.kwargs.values()))


def _returns_a_view_outside_aten(op) -> bool:
    schema = getattr(op, "_schema", None)
    return (isinstance(op, torch._ops.OpOverload) and op.namespace != "aten"
            and schema is not None and any(r.alias_info is not None for r in schema.returns))


def _op_name(op) -> str:
    return op.name() if isinstance(op, torch._ops.OpOverload) else getattr(op, "__name__", str(op))


class OnnxTarget(Target):
    name, device, backend, description = ONNX.name, ONNX.device, ONNX.backend, ONNX.description
    Options = OnnxOptions
    # "fused": GroupQueryAttention (targets/onnx/contrib_ops.py). decode_on_prefill: ORT
    # prepacks MatMul and MatMulNBits weights per session, and its Python API cannot share
    # prepacked weights between sessions: a decode session of its own held a second
    # packed copy. The prefill session run at one token decodes as fast.
    generation = Generation(step_attention="fused", decode_on_prefill=True)
    partitioning = Partitioning(complex_boundaries=False)  # ONNX has no complex type
    # ONNX Runtime's tools, applied in lower() to the exported model: no PT2E pass
    quantization = Quantization(recipes=RECIPES)
    packaging = OnnxPackaging()
    tooling = OnnxTooling()

    def availability(self) -> Availability:
        return Availability(*onnx_here())

    def supports(self, node: Node) -> Support:
        op = node.target
        name = _op_name(op)
        if name in _DROPPED_CHECKS:
            return Support(True, "runtime check; the ONNX exporter removes it")
        missing = [p for p in _missing_packages() if p != "onnxruntime"]
        if missing:  # the exporter's registry is built from onnxscript's torchlib
            return Support(False, f"{', '.join(missing)} not installed, so torch.onnx has "
                                  "no translations; " + install_command("onnx"))
        if contrib_ops.supports(op):
            return Support(True, "ONNX Runtime contrib op (targets/onnx/contrib_ops.py)")
        if _returns_a_view_outside_aten(op):
            # torch.onnx's functionalization refuses it, failing the whole partition
            # (prims.broadcast_in_dim from a decomposition; 907 ops once for Gemma 3n's std)
            return Support(False, f"{name} returns a view of its input, which torch.onnx "
                                  "cannot functionalize for an op outside aten")
        registry, decompositions = _exporter_tables()
        # Lookup is by exact overload, as the exporter's dispatcher does (it keys
        # OpOverloads by op.name(), e.g. 'aten::add.Tensor'; no packet fallback).
        metas = registry.get_decomps(op)
        wanted = _has_complex_input(node)
        usable = [m for m in metas if m.is_complex == wanted]
        if usable:
            fn = usable[0].onnx_function
            origin = "custom" if usable[0].is_custom else "torchlib"
            fn_name = getattr(fn, "name", None) or getattr(fn, "__name__", str(fn))
            return Support(True, f"ONNX exporter has a translation ({origin} {fn_name})")
        if metas:
            kind = "complex" if wanted else "real"
            return Support(False, f"the ONNX translation of {name} does not take {kind} inputs")
        # run_decompositions applies the table, and always inlines CompositeImplicit ops
        # that export cannot preserve; either way the pieces are translated instead.
        if isinstance(op, torch._ops.OpOverload) and (op in decompositions or op._can_decompose()):
            return Support(True, "decomposed, then translated")
        return Support(False, f"no ONNX translation registered for {name}"
                              + (" (custom op)" if is_custom_op(op) else ""))

    def default_passes(self, options: LowerOptions) -> list[Pass]:
        # no PT2E pass: ORT quantizes the exported ONNX model (lower()); RMSNorms written
        # in the form ORT fuses into one kernel (its fusion wants a Div); torch.onnx's own
        # decomposition last, so placement judges the graph the exporter will translate
        fusable_norms = [RsqrtAsDivision()] if options.fuse else []
        # an int tensor cast before `number - tensor`, which torch.onnx cannot translate
        return pipeline(options, fusions=GRAPH_FUSIONS) + fusable_norms + [CastBeforeRsub(),
            Decompose(lambda: _exporter_tables()[1], "torch.onnx"), ContiguousBeforeReshape()]

    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        providers = self.own_options(options).providers
        fallback = FallbackPolicy(options.fallback).value
        missing = _missing_packages()
        if missing:
            raise TargetOptionError(f"target 'onnx' needs {', '.join(missing)}",
                                    hint=install_command("onnx"))
        refuse_bf16_on_cpu_only(options.dtype, providers)
        import onnx
        import onnxruntime

        options.work_dir.mkdir(parents=True, exist_ok=True)
        path = options.work_dir / MODEL_NAME
        onnx_program = self._export(program, options)
        inside.label_modules(onnx_program.model, program)  # reports name layers by module
        if options.fuse:  # graph patterns ORT runs as one kernel (rotary.py, skip_norm.py)
            log.info("%d rotary embedding(s) as RotaryEmbedding, %d Add + RMSNorm as "
                     "SkipSimplifiedLayerNormalization",
                     fuse_rotary_embeddings(onnx_program.model),
                     fuse_skip_rms_norms(onnx_program.model))
        log.info("%d GroupQueryAttention node(s) share the first's sequence lengths",
                 contrib_ops.share_sequence_lengths(onnx_program.model))
        if options.fuse:  # packed Q/K/V, rotary inside (packed_attention.py)
            log.info("%d GroupQueryAttention node(s) take packed rows and rotate them",
                     pack_attention_inputs(onnx_program.model))
        in_place = contrib_ops.expose_in_place_cache(onnx_program.model)
        stored = store_new_rows(onnx_program.model, in_place)  # stored_rows.py: why
        log.info("%d new-row output(s) left where the attention kernel stored them",
                 len(stored.outputs))
        weights = sum(v.const_value.nbytes for v in onnx_program.model.graph.initializers.values()
                      if v.const_value is not None)
        onnx_program.save(str(path), external_data=weights > EXTERNAL_DATA_BYTES)
        del onnx_program  # the weights our ONNX rewrites made (packed Q/K/V) go with it
        quantization = (self._quantize(program, options, path, weights > EXTERNAL_DATA_BYTES)
                        if options.quantize else None)
        model = onnx.load(str(path), load_external_data=False)
        external = external_files(model)
        try:
            onnx.checker.check_model(str(path), full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            raise self._error("the ONNX checker rejected the exported model", exc, options,
                              program, where=str(path)) from exc

        kernels, notes = None, []  # our kernels run the nbits recipes' GEMVs (kernels/)
        if (self.own_options(options).own_kernels
                and options.quantize in ("int8-weight", "int4-weight")):
            kernels, note = own_kernels.apply(path, options.platform)
            notes += [note] if note else []
        weights = {}
        if options.shared_weights:  # after the checker, which reads every initializer
            weights, external = externalize(path), []
        files = {MODEL_NAME: path, **{name: options.work_dir / name for name in external}}
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        meta = OnnxRuntimeMeta(
            model=MODEL_NAME, external_data=tuple(external), providers=tuple(providers),
            opset=opset, fallback=fallback,
            disable_cpu_ep_fallback=fallback == FallbackPolicy.FORBID.value,
            onnxruntime=onnxruntime.__version__, onnx=onnx.__version__,
            quantization=quantization, in_place=in_place or None,
            stored_outputs=stored.outputs or None, stored_into=stored.into or None,
            rows_start=stored.positions,
            shared_files=True if weights else None, **_kernels_meta(kernels)).to_json()
        here = onnxruntime.get_available_providers()
        notes += [f"execution provider {p} is not available on this machine; the build's "
                  f"validation runs without it" for p in providers if p not in here]
        if kernels:
            files[own_kernels.LIBRARY] = kernels.library
        return Lowered(files=files, meta=meta, requirements=_requirements(kernels),
                       notes=notes, weights=weights)

    def _export(self, program: ExportedProgram, options: LowerOptions):
        """torch.onnx with its defaults (opset, optimize=True). An ExportedProgram is taken
        as is: its symbolic dims (s0, ...) become ONNX dim_params, so a dynamic batch stays
        dynamic without passing dynamic_shapes again."""
        report_dir = new_report_dir(options)
        start = time.perf_counter()
        try:
            with quiet_registry(), without_input_guards(program), exact_no_op_rules():
                onnx_program = torch_onnx.export(program, report_dir, contrib_ops.translations())
        except Exception as exc:  # torch.onnx raises several types; keep the full text
            scratch.release(report_dir)
            raise self._error("torch.onnx could not export the program", exc, options,
                              program, report_dir=report_dir) from exc
        except BaseException:  # Ctrl-C or SIGTERM mid-export: nothing of it stays behind
            scratch.remove(report_dir)
            raise
        # report=True writes a report on success too; it is only useful on failure.
        scratch.remove(report_dir)
        log.info("torch.onnx exported %s in %.1f s", options.work_dir,
                 time.perf_counter() - start)
        return onnx_program

    def _quantize(self, program: ExportedProgram, options: LowerOptions, path: Path,
                  external: bool) -> dict:
        """ONNX Runtime's quantizer over the saved model at ``path``, which it replaces;
        the quantization report."""
        import onnx
        try:
            quantized, quantization = quantize_model(
                path, options.quantize, list(options.calibration), _example_sets(program),
                block=self.own_options(options).block_for(options.quantize),
                platform=options.platform)
        except TargetOptionError:
            raise
        except Exception as exc:  # noqa: BLE001 - ORT's quantizer raises many kinds
            # Not movable: the CPU fallback would run these ops in float, and the build would
            # pass as a quantized one that quantized nothing. Where: the log of its full
            # text (the model's scratch folder goes with the failed build).
            error = self._error(f"ONNX Runtime's {options.quantize} quantization failed", exc,
                                options, program, movable=False)
            error.hint += ("; or build with another --quantize recipe (`exporter targets` "
                           "lists them), or none")
            raise error from exc
        exported = onnx.load(str(path), load_external_data=False)
        for name in [MODEL_NAME, *external_files(exported)]:
            (options.work_dir / name).unlink()  # replaced by the quantized model's files
        onnx.save_model(quantized, str(path), save_as_external_data=external,
                        all_tensors_to_one_file=True, location=MODEL_NAME + ".data")
        return quantization

    def _error(self, what: str, exc: Exception, options: LowerOptions, program: ExportedProgram,
               *, where: str | None = None, report_dir: Path | None = None,
               movable: bool = True) -> LoweringError:
        partition = options.partition or options.work_dir.name
        found = re.search(r"saved to '([^']+)'", str(exc))  # torch.onnx's own report
        report = found.group(1) if found else None
        unsupported = sorted({f"{_op_name(n.target)}: {s.reason}"
                              for n in program.graph.nodes if n.op == "call_function"
                              for s in [self.supports(n)] if not s.ok})
        error = LoweringError.from_exception(
            exc, f"{what} (partition '{partition}')", target=self.name, partition=partition,
            log_dir=report_dir or options.logs, details=unsupported, where=where or report,
            hint="run with --debug", movable=movable)
        if report_dir is not None:
            error.kept.append(report_dir)
        report = report or (None if where else error.where)
        error.hint = ((f"read the report at {report}" if report else "run with --debug")
                      + ("; the ops listed have no ONNX translation: place them on another "
                         "target" if unsupported and movable else ""))
        return error


# torch.onnx's export report: removed on success, kept (and released from the scratch
# registry, so no later build sweeps it) when an error message points the user to it.


def _kernels_meta(kernels: own_kernels.Kernels | None) -> dict:
    """OnnxRuntimeMeta's record of the nodes on our kernels and what they need."""
    if kernels is None:
        return {}
    return dict(kernels=own_kernels.LIBRARY, kernels_platform=own_kernels.PLATFORM,
                kernels_isa=own_kernels.ISA, kernels_cpu_flags=own_kernels.CPU_FLAGS,
                kernels_nodes=kernels.nodes)


def _requirements(kernels: own_kernels.Kernels | None) -> Requirements:
    """This machine's; with our kernels, their ISA too (reports; the executor checks it)."""
    base = base_requirements()
    if kernels is None:
        return base
    return dataclasses.replace(base, cpu_isa=own_kernels.ISA, cpu_flags=own_kernels.CPU_FLAGS)


def _example_sets(program: ExportedProgram) -> list[list[torch.Tensor]]:
    """The partition's example inputs (the capture's, or what the earlier partitions
    computed from them), flat, as one input set; none when the program kept none."""
    if program.example_inputs is None:
        return []
    return [flatten_inputs(*program.example_inputs).tensors]


"""Target ``executorch``: each partition becomes one ExecuTorch ``.pte`` program, run by
ExecuTorch's runtime (phones, small boards, microcontrollers; here its Python runtime).

Inside a partition, XNNPACK takes what its partitioner's configs claim and ExecuTorch's
own kernels run the rest. Op support is read from ExecuTorch itself
(targets/executorch/support.py): the configs, and the kernel registry of the runtime
the wheel ships. Placement judges the graph after ExecuTorch's own edge decomposition
table, as ``to_edge_transform_and_lower`` will see it.
"""

from __future__ import annotations

import logging
import time

from torch.export import ExportedProgram
from torch.fx import Node

from passes.base import Pass
from passes.cleanup.decompose import Decompose
from runtime.executors.executorch import ExecutorchMeta
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
from targets.executorch import support
from targets.executorch.embedding_byte import EmbeddingByte
from targets.executorch.facets import ExecutorchPackaging, ExecutorchTooling
from targets.executorch.floor_remainder import FloorRemainder
from targets.executorch.lower import METHOD, PROGRAM_NAME, lower_program, version
from targets.executorch.quantize import RECIPES, XnnpackQuantization
from targets.card import install_command
from targets.facets import Generation
from targets.fusion import GRAPH_FUSIONS

log = logging.getLogger(__name__)

_INSTALL = install_command("executorch")  # the clone's path: works from any folder


class ExecutorchTarget(Target):
    name = "executorch"
    device = "cpu"
    backend = "executorch"
    description = ("ExecuTorch .pte program per partition: XNNPACK delegate plus "
                   "ExecuTorch's portable kernels")
    packaging = ExecutorchPackaging()
    quantization = XnnpackQuantization(recipes=RECIPES)
    # decode_on_prefill: a .pte program carries its own weights and XNNPACK packs them per
    # program, so a decode program of its own was a second copy in the artifact, in memory
    # and in the build's lowering; ExecuTorch's own LLM export decodes on one dynamic method
    generation = Generation(decode_on_prefill=True)
    tooling = ExecutorchTooling()

    def availability(self) -> Availability:
        if not support.installed():
            return Availability(False, f"executorch is not installed; {_INSTALL}")
        return Availability(True, f"executorch {version()}")

    def supports(self, node: Node) -> Support:
        if not support.installed():
            return Support(False, "executorch is not installed")
        return Support(*support.decide(node))

    def default_passes(self, options: LowerOptions) -> list[Pass]:
        # ExecuTorch's edge decomposition last, so placement judges what its partitioner
        # and kernel registry will be asked about; quantization before it, as PT2E
        # annotates ATen ops (conv + batch norm, linear) before they decompose
        # int8 tables then become ExecuTorch's embedding_byte kernel (embedding_byte.py)
        quantize = self.quantization.quantize_pass(options, self.device)
        tables = [EmbeddingByte()] if quantize is not None else []
        return pipeline(options, quantize, fusions=GRAPH_FUSIONS) + tables + [
            FloorRemainder(), Decompose(support.decomposition_table, "ExecuTorch edge")]

    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        if not support.installed():
            raise TargetOptionError("target 'executorch' needs executorch", hint=_INSTALL)
        options.work_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        try:
            lowered = lower_program(program)
        except Exception as exc:  # ExecuTorch raises many kinds; keep its full text
            partition = options.partition or options.work_dir.name
            raise LoweringError.from_exception(
                exc, f"ExecuTorch could not lower partition '{partition}'",
                target=self.name, partition=partition, log_dir=options.logs) from exc
        path = options.work_dir / PROGRAM_NAME
        path.write_bytes(lowered.buffer)
        planned = sum(lowered.buffer_sizes)
        meta = ExecutorchMeta(
            program=PROGRAM_NAME, method=METHOD, executorch=version(),
            xnnpack_ops=lowered.xnnpack_ops, portable_ops=lowered.portable_ops,
            delegates=lowered.delegates, subgraphs=lowered.subgraphs, kernels=lowered.kernels,
            placement=lowered.placement, buffer_sizes=lowered.buffer_sizes,
            planned_bytes=planned, bounds=lowered.bounds or None)
        notes = []
        if lowered.bounds:
            notes.append(f"ExecuTorch plans memory for the upper bound of each dynamic dim "
                         f"({', '.join(f'{k} in {v}' for k, v in lowered.bounds.items())}): "
                         f"{planned} bytes of arenas")
        log.info("ExecuTorch: %d op(s) in %d XNNPACK delegate(s), %d on its kernels, "
                 "%d planned bytes", lowered.xnnpack_ops, lowered.delegates,
                 lowered.portable_ops, planned)
        return Lowered(files={PROGRAM_NAME: path}, meta=meta.to_json(),
                       requirements=base_requirements(), notes=notes,
                       seconds={"compile_seconds": round(time.perf_counter() - start, 2)})

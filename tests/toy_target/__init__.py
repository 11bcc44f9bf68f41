"""A toy target, registered by the contract suite: it delegates ``aten.relu`` (nothing
else) to a trivial executor kind, ``toy-relu``. It shows what a new target is: this folder
and one ``targets.register(ToyTarget())`` line; no edit anywhere else. It fills the
contract's required part and one facet, the packaging that names the module registering
its executor kind; every other facet keeps its defaults (targets/facets/)."""

from __future__ import annotations

import json

import torch
from pydantic import Field
from torch.export import ExportedProgram
from torch.fx import Node

from passes.base import Pass
from targets import (
    Availability,
    Lowered,
    LowerOptions,
    Packaging,
    Support,
    Target,
    TargetOptions,
    base_requirements,
)
from targets.base import pipeline
from tests.toy_target.executor import BACKEND, ToyMeta


class ToyOptions(TargetOptions):
    toy_note: str = Field("relu", description="a note the toy writes into its partition file",
                          examples=["a note"])


class ToyTarget(Target):
    name = "toy"
    device = "cpu"
    backend = BACKEND
    description = "test-only: aten.relu on a trivial executor"
    Options = ToyOptions
    packaging = Packaging(runtime_modules=("tests.toy_target.register",))  # its executor

    def availability(self) -> Availability:
        return Availability(True, "always (pure Python)")

    def supports(self, node: Node) -> Support:
        if node.target is torch.ops.aten.relu.default:
            return Support(True, "the toy runs relu")
        return Support(False, f"the toy runs only relu, not {node.target}")

    def default_passes(self, options: LowerOptions) -> list[Pass]:
        return pipeline(options)

    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        ops = [n for n in program.graph.nodes if n.op == "call_function"]
        if any(n.target is not torch.ops.aten.relu.default for n in ops):
            raise ValueError("the toy was handed an op it did not claim")
        options.work_dir.mkdir(parents=True, exist_ok=True)
        path = options.work_dir / "relu.json"
        note = self.own_options(options).toy_note
        path.write_text(json.dumps({"relus": len(ops), "note": note}))
        meta = ToyMeta(program="relu.json", relus=len(ops))
        return Lowered(files={"relu.json": path}, meta=meta.to_json(),
                       requirements=base_requirements())

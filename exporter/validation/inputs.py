"""The input sets a build validates on: user data first, then the example, then random
draws at the min and max of every dynamic dim (seeded, with a warning)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from exporter.errors import UserInputError
from runtime.format.manifest import Signature, TensorSpec
from runtime.host.tensorio import load_npz
from runtime.program.torch_program import check_inputs



@dataclass
class Case:
    name: str
    origin: str  # "user", "example", "random-min", "random-max"
    inputs: dict[str, torch.Tensor]

    def describe(self) -> dict:
        return {"name": self.name, "origin": self.origin,
                "shapes": {k: list(v.shape) for k, v in self.inputs.items()}}


def make_cases(signature: Signature, example: list[torch.Tensor], user_file: Path | None,
               seed: int) -> tuple[list[Case], list[str]]:
    names = [spec.name for spec in signature.inputs]
    cases = []
    if user_file is not None:
        cases.append(Case("user", "user", load_input_file(signature, user_file)))
    cases.append(Case("example", "example", dict(zip(names, (t.cpu() for t in example)))))
    warnings = []
    dynamic = any(d.is_dynamic for spec in signature.inputs for d in spec.shape)
    if user_file is None and dynamic:
        generator = torch.Generator().manual_seed(seed)
        for end in ("min", "max"):
            draw = {spec.name: draw_like(spec, ex.cpu(), end, generator)
                    for spec, ex in zip(signature.inputs, example)}
            cases.append(Case(f"random-{end}", f"random-{end}", draw))
    # what random cases can hide is said once, beside the verdict (report.console.random_note)
    return cases, warnings


def load_input_file(signature: Signature, path: Path) -> dict[str, torch.Tensor]:
    data = load_npz(path)
    names = [spec.name for spec in signature.inputs]
    missing = [n for n in names if n not in data]
    extra = sorted(set(data) - set(names))
    if missing or extra:
        raise UserInputError(
            f"{path} does not hold the model's inputs",
            details=[f"missing '{n}'" for n in missing] + [f"unexpected '{n}'" for n in extra],
            where=str(path), hint=f"save arrays named {', '.join(names)} with numpy.savez")
    tensors = [torch.from_numpy(data[n]) for n in names]
    check_inputs(signature.inputs, tensors, where=str(path))
    return dict(zip(names, tensors))


def draw_like(spec: TensorSpec, example: torch.Tensor, end: str, gen: torch.Generator) -> torch.Tensor:
    shape = [d.size if not d.is_dynamic else getattr(d, end) for d in spec.shape]
    dtype = example.dtype
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if not dtype.is_floating_point:
        if example.numel() == 0:
            return torch.zeros(shape, dtype=dtype)
        lo, hi = int(example.min()), int(example.max())
        return torch.randint(lo, hi + 1, shape, generator=gen, dtype=dtype)
    ex = example.double()
    mean = float(ex.mean()) if ex.numel() else 0.0
    std = float(ex.std()) if ex.numel() > 1 else 1.0
    values = torch.randn(shape, generator=gen, dtype=torch.float64) * (std or 1.0) + mean
    return values.to(dtype)

"""Where a generating build's failed exact gate parts from eager: the step that chose the
first divergent token is bisected to a partition, as a plain build's mismatch is
(exporter/validation/bisect.py, whose lines it prints).

The step is re-created exactly: the captured programs, interpreted eagerly, fill a cache
through the prompt (and the tokens the artifact generated before the divergence) in the
chunks the runtime uses, then the failing call (the prompt's last prefill chunk for the
first token, else one ``decode`` step) is the bisect's case. Its partitions are fed
eager's values of their inputs and the first whose outputs differ is named, with its ops
and their source lines.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves, tree_unflatten

from exporter.builder.prepared import Prepared
from exporter.validation.bisect import bisect
from exporter.validation.inputs import Case
from runtime.format.manifest import Manifest
from runtime.generation.cache import KvCache

log = logging.getLogger(__name__)


def bisect_generation(artifact: Path, manifest: Manifest, preps: dict[str, Prepared],
                      prompt: list[int], tokens: list[int], step: int, case: str,
                      dtype: str) -> dict | None:
    """The bisect of the call that chose ``tokens[step]`` after ``prompt``, or None where
    it cannot be re-created (an encoder-decoder) or the bisect itself breaks: it helps read
    a failure and never replaces it."""
    if manifest.generation.source is not None:
        return None  # an encoder-decoder's step also reads its cross cache: not re-created
    try:
        with torch.no_grad():
            return _bisect_step(artifact, manifest, preps, prompt, tokens, step, case, dtype)
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        log.warning("could not bisect the divergence (%s: %s)", type(exc).__name__, exc)
        log.debug("the bisect's traceback", exc_info=True)
        return None


def _bisect_step(artifact: Path, manifest: Manifest, preps: dict[str, Prepared],
                 prompt: list[int], tokens: list[int], step: int, case: str,
                 dtype: str) -> dict:
    chunk = manifest.generation.prefill_chunk
    sequence = prompt + tokens[:step]
    # the call that produced the logits of tokens[step]: the prompt's last chunk (step 0)
    # or the decode of the token before it
    start = (len(prompt) - 1) // chunk * chunk if step == 0 else len(sequence) - 1
    device = preps["prefill"].target.device
    modules: dict[str, torch.nn.Module] = {}  # each program's module, built once
    cache = KvCache(manifest.generation.cache, device)
    for begin in range(0, start, chunk):  # the cache the failing call reads, eagerly
        _run(preps, modules, cache, sequence[begin:min(begin + chunk, start)], begin, device)
    name, flat = _call(preps, cache, sequence[start:], start, device)
    prep = preps[name]
    signature = (manifest.entry_points[name] if name != "prefill" else manifest).signature
    inputs = {spec.name: tensor for spec, tensor in zip(signature.inputs, flat)}
    eager_outputs = _outputs(prep, modules, name, flat)
    return bisect(artifact, manifest, prep.program,
                  Case(name=f"{case} step {step} ({name}, positions {start}..{len(sequence) - 1})",
                       origin="generation", inputs=inputs),
                  eager_outputs, dtype, device,
                  {plan.name: plan.program for plan in prep.placement.plans},
                  entry=None if name == "prefill" else name)


def _call(preps: dict[str, Prepared], cache: KvCache, ids: list[int], start: int,
          device: str) -> tuple[str, list[torch.Tensor]]:
    """The entry point the runtime calls for ``ids`` at ``start`` and its flat inputs."""
    name = "decode" if len(ids) == 1 and "decode" in preps else "prefill"
    given = {"input_ids": torch.tensor([ids], device=device),
             "positions": torch.arange(start, start + len(ids), device=device), **cache.buffers}
    return name, [given[spec.name] for spec in preps[name].captured.signature.inputs]


def _run(preps: dict[str, Prepared], modules: dict, cache: KvCache, ids: list[int],
         start: int, device: str) -> None:
    name, flat = _call(preps, cache, ids, start, device)
    names = [spec.name for spec in preps[name].captured.signature.outputs]
    cache.write(torch.arange(start, start + len(ids), device=device),
                dict(zip(names, _outputs(preps[name], modules, name, flat))))


def _outputs(prep: Prepared, modules: dict, name: str, flat: list[torch.Tensor]
             ) -> list[torch.Tensor]:
    """The captured program interpreted eagerly on ``flat`` (its user inputs in order)."""
    if name not in modules:
        modules[name] = prep.program.module()
    args, kwargs = tree_unflatten(list(flat), prep.program.call_spec.in_spec)
    return list(tree_leaves(modules[name](*args, **kwargs)))

"""A generating build's prepared entry points, and how their lowered partitions become
one artifact: both entry points' partitions, the weights once, the tokenizer, and the
generation section the runtime reads (exporter/lm/build.py runs the stages)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from exporter.builder.prepared import Prepared
from exporter.builder.shared_weights import share_weights
from exporter.builder.stages import manifest_for
from exporter.kinds import GENERATING_TASK
from exporter.lm.seq2seq import Source
from exporter.lm.source import TOKENIZER_FILE, LanguageModel
from exporter.settings import NOT_RECORDED, BuildSettings
from runtime.format.manifest import EntryPoint, Manifest
from runtime.generation.layout import CacheLayout, shortest_source
from runtime.generation.section import GenerationSection

TOKENIZER_ENTRY = f"generation/{TOKENIZER_FILE}"


@dataclass
class PreparedGeneration:
    """Everything up to lowering, per entry point (what ``--dry-run`` reports)."""

    lm: LanguageModel
    layout: CacheLayout
    context: int
    chunk: int
    preps: dict[str, Prepared]  # "prefill", "decode" (and "encode": an encoder-decoder)
    source: Source | None = None  # an encoder-decoder's encoder input


def assemble(prepared: PreparedGeneration, lowered: dict, settings: BuildSettings,
             work_dir: Path) -> tuple[Manifest, dict[str, Path]]:
    """The manifest and the artifact's files: both entry points' partitions, the weights
    once (exporter/builder/shared_weights.py), the tokenizer."""
    lm, preps = prepared.lm, prepared.preps
    store, store_files = share_weights([low for pairs in lowered.values()
                                        for _, low in pairs], work_dir)
    manifest = _manifest(preps, lowered, settings, prepared)
    manifest.shared_weights = store or None
    files = {f"partitions/{plan.name}/{file}": path for pairs in lowered.values()
             for plan, low in pairs for file, path in low.files.items()}
    files.update(store_files)
    if lm.tokenizer is not None:
        files[TOKENIZER_ENTRY] = lm.tokenizer
    notes = [n for pairs in lowered.values() for _, low in pairs for n in low.notes]
    manifest.build = {"settings": settings.model_dump(mode="json", exclude=NOT_RECORDED),
                      "notes": _unique([w for prep in preps.values() for w in prep.warnings]
                                       + notes),
                      "nondeterminism": preps["prefill"].target.packaging.nondeterminism(
                          preps["prefill"].options)}
    return manifest, files


def _manifest(preps: dict[str, Prepared], lowered: dict, settings: BuildSettings,
              prepared: PreparedGeneration) -> Manifest:
    lm, layout, context, chunk = (prepared.lm, prepared.layout, prepared.context,
                                  prepared.chunk)
    manifest = manifest_for(preps["prefill"], settings, lowered["prefill"])
    manifest.entry_points = {}
    for name in preps:
        if name != "prefill":
            entry = manifest_for(preps[name], settings, lowered[name])
            manifest.entry_points[name] = EntryPoint(entry.signature, entry.partitions,
                                                     entry.memory_plan, entry.placement,
                                                     entry.coverage, entry.passes)
    manifest.source = {"spec": lm.source, "model_class": type(lm.model).__qualname__,
                       "task": GENERATING_TASK, "max_context": context,
                       "prefill_chunk": chunk, "decode_on_prefill": "decode" not in preps,
                       **({"encoder": prepared.source.to_json()} if prepared.source else {})}
    manifest.generation = GenerationSection(
        cache=layout, max_context=context, prefill_chunk=chunk,
        token_ids={key: tuple(ids) for key, ids in lm.token_ids.items()},
        generation_config=lm.generation_config,
        source=_source_record(prepared.source, manifest) if prepared.source else None,
        tokenizer=TOKENIZER_ENTRY if lm.tokenizer is not None else None,
        cache_bytes=layout.nbytes(torch.empty((), dtype=getattr(torch, layout.dtype))
                                  .element_size()))
    return manifest


def _source_record(source: Source, manifest: Manifest) -> dict:
    """The source as the runtime reads it, with the fewest tokens ``encode`` takes (the
    validation generates from a source that short)."""
    record = source.to_json()
    if source.masked:
        record["shortest"] = shortest_source(manifest.entry_points["encode"].signature)
    return record


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


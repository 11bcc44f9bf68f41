"""``manifest.generation`` as a typed section (runtime/generation/section.py): what the build
writes reads back the same, and a hostile or broken field is an ArtifactError naming it
when the manifest is read, before any program or cache exists. What the section must agree
with in the programs: tests/trust/test_trust_generation.py."""

from __future__ import annotations

import copy
import json
import zipfile

import pytest

import runtime
from runtime.errors import ArtifactError
from runtime.format.manifest import Manifest
from runtime.generation.section import GenerationSection

SECTION = {
    "cache": {"batch": 1, "dtype": "float32",
              "layers": [{"slots": 12, "window": 12, "key_shape": [2, 8], "value_shape": [2, 8]},
                         {"slots": 64, "window": None, "key_shape": [2, 8],
                          "value_shape": [2, 8]}],
              "cross": [{"slots": 16, "window": None, "key_shape": [2, 8],
                         "value_shape": [2, 8]}]},
    "max_context": 64, "prefill_chunk": 16, "tokenizer": "tokenizer.json",
    "bos_token_ids": [1], "eos_token_ids": [2, 3], "pad_token_ids": [],
    "decoder_start_token_ids": [0],
    "generation_config": {"forced_decoder_ids": [[1, 5], [2, None]], "suppress_tokens": [7],
                          "lang_to_id": {"<|en|>": 9}},
    "source": {"input": "input_ids", "bound": 16, "shortest": 1},
    "cache_bytes": 12345,
}


def test_a_section_reads_back_as_the_json_it_was_written_from():
    section = GenerationSection.from_json(copy.deepcopy(SECTION), where="test")
    assert section.to_json() == SECTION
    assert GenerationSection.from_json(section.to_json(), where="test") == section
    assert section.eos == {2, 3} and section.decoder_start == [0]
    assert section.cache.layers[0].window == 12 and len(section.cache.cross) == 1
    plain = {k: v for k, v in SECTION.items() if k not in ("source", "cache_bytes",
                                                          "decoder_start_token_ids")}
    assert GenerationSection.from_json(plain, where="test").to_json() == plain


def _changed(**change):
    raw = copy.deepcopy(SECTION)
    for key, value in change.items():
        if value is None:
            raw.pop(key)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("raw, needle", [
    ([], "not a JSON object but list"),
    (_changed(max_context=None), "'max_context' is missing"),
    (_changed(max_context="64"), "max_context must be a positive integer"),
    (_changed(prefill_chunk=0), "prefill_chunk must be a positive integer"),
    (_changed(prefill_chunk=2**40), "prefill_chunk must be a positive integer"),
    (_changed(eos_token_ids=[True]), "eos_token_ids must be a list of integers"),
    (_changed(bos_token_ids="1"), "bos_token_ids must be a list of integers"),
    (_changed(eos_token_ids=list(range(70_000))), "eos_token_ids must be a list of integers"),
    (_changed(cache=None), "'cache' is missing"),
    (_changed(cache={"batch": 1, "dtype": "float32", "layers": []}), "cache: "),
    (_changed(cache={**SECTION["cache"], "batch": -1}), "cache: the cache layout's batch"),
    (_changed(source={"input": "pixels"}), "source must name its input"),
    (_changed(source={"input": "input_ids", "bound": 0}), "source.bound"),
    (_changed(source={"input": "input_features", "shape": [80]}), "source.shape"),
    (_changed(tokenizer=5), "tokenizer must name an entry"),
    (_changed(generation_config=[]), "generation_config must be an object"),
    (_changed(generation_config={"suppress_tokens": ["x"]}), "generation_config.suppress_tokens"),
    (_changed(generation_config={"forced_decoder_ids": [[1]]}), "forced_decoder_ids"),
    (_changed(cache_bytes=-1), "cache_bytes must be a non-negative integer"),
], ids=["not-object", "no-context", "context-text", "chunk-0", "chunk-huge", "eos-bool",
        "bos-text", "eos-70k", "no-cache", "cache-no-layers", "cache-negative-batch",
        "source-input", "source-bound", "source-shape", "tokenizer-number", "config-list",
        "suppress-text", "forced-pair", "cache-bytes-negative"])
def test_a_bad_field_is_an_artifact_error_naming_it(raw, needle):
    with pytest.raises(ArtifactError, match="generation section is malformed") as caught:
        GenerationSection.from_json(raw, where="model.artifact")
    assert needle in str(caught.value) and caught.value.where == "model.artifact"


def test_the_manifest_reader_refuses_a_bad_section_naming_the_field(onnx_lm, tmp_path):
    """Read with the manifest, so `runtime.load`, `exporter inspect` and the report refuse
    it alike, and never as "the manifest is malformed (TypeError: ...)"."""
    built, _ = onnx_lm
    with zipfile.ZipFile(built.artifact) as archive:
        raw = json.loads(archive.read("manifest.json"))
    assert Manifest.from_dict(raw).generation.to_json() == raw["generation"]
    assert runtime.read_manifest(built.artifact).generation == built.manifest.generation
    raw["generation"]["prefill_chunk"] = "16"
    with pytest.raises(ArtifactError, match="prefill_chunk must be a positive integer") as caught:
        Manifest.from_dict(raw, where=str(built.artifact))
    assert "manifest is malformed" not in str(caught.value)

"""An engine registered from outside bench/llm, the way ``exporter bench`` will add the
exported artifact: tests/exporter/lm/test_llm_bench.py passes ``--engine-module tests.llm_engine_plugin``.
It is Hugging Face eager under another name, so its ids must equal hf-eager's."""

from bench.llm import engines_hf
from bench.llm.registry import register_engine

register_engine("hf-eager-plugin", engines_hf.load_eager)

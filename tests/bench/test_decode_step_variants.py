"""bench/decode_step_cuda.py's variants: each flag variant changes fields the cuda
target's generation facet has, and bench/pending's A/B scripts ask for variants it has."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from bench import decode_step_cuda
from targets.facets.generation import Generation

ROOT = Path(__file__).resolve().parents[2]


def test_flag_variants_change_generation_fields_of_the_cuda_target():
    from targets.aoti.cuda import CudaTarget
    fields = {f.name for f in dataclasses.fields(Generation)}
    assert set(decode_step_cuda.FLAGS) <= set(decode_step_cuda.VARIANTS)
    for variant, changed in decode_step_cuda.FLAGS.items():
        assert changed and set(changed) <= fields, variant
        assert all(getattr(CudaTarget.generation, f) != v for f, v in changed.items()), variant


def test_the_pending_scripts_ask_for_variants_the_bench_has():
    for script in (ROOT / "bench" / "pending").glob("*.sh"):
        text = script.read_text()
        if "decode_step_cuda.py" not in text or not re.search(r"--variant\s", text):
            continue  # a chain script, or builds as the target is (their loops name folders)
        loops = re.findall(r"for V in ([\w -]+); do", text)
        asked = {v for loop in loops for v in loop.split()}
        assert asked and asked <= set(decode_step_cuda.VARIANTS), script.name

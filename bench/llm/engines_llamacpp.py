"""llama.cpp through ``llama-cpp-python``: the checkpoint converted to GGUF f32 by llama.cpp's
own ``convert_hf_to_gguf.py``, then quantized to Q8_0
and Q4_0 with ``llama_cpp.llama_model_quantize`` (its defaults: Q4_0 keeps output.weight at
Q6_K; the variant string lists what the file holds).

The converter is not in the wheel: it ships in the llama-cpp-python sdist under
vendor/llama.cpp. ``python -m bench.llm.engines_llamacpp --extract SDIST`` copies it to
build/llm/llama.cpp (``make bench-llm`` does); ``LLAMA_CPP_CONVERTER`` may name another
convert_hf_to_gguf.py.

The converter runs with the gguf-py copied from beside it, not the ``gguf`` package from
PyPI: gguf 0.19.0 (PyPI's newest) lacks ``gguf.LazyChunkedTensor``, which the converter of
llama-cpp-python 0.3.36 uses (AttributeError in prepare_tensors). The PyPI package only
reads the files' tensor types here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from bench.llm.engine import EngineRequest, Loaded

QUANTS = ("F32", "Q8_0", "Q4_0")
CONVERTER_DIR = Path("build/llm/llama.cpp")


def converter_script() -> Path:
    path = Path(os.environ.get("LLAMA_CPP_CONVERTER", CONVERTER_DIR / "convert_hf_to_gguf.py"))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: llama.cpp's convert_hf_to_gguf.py is not there; run "
            "`python -m bench.llm.engines_llamacpp --extract llama_cpp_python-X.tar.gz` "
            "(the sdist pip built llama-cpp-python from) or set LLAMA_CPP_CONVERTER")
    return path


def extract_converter(sdist: Path, dest: Path = CONVERTER_DIR) -> Path:
    """Copy vendor/llama.cpp/{convert_hf_to_gguf.py, conversion/, gguf-py/} out of the sdist."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) < 4 or parts[1:3] != ("vendor", "llama.cpp") or not member.isfile():
                continue
            inner = Path(*parts[3:])
            if inner.name == "convert_hf_to_gguf.py" and len(inner.parts) == 1 \
                    or inner.parts[0] in ("conversion", "gguf-py"):
                target = dest / inner
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    return converter_script() if dest == CONVERTER_DIR else dest / "convert_hf_to_gguf.py"


def gguf_path(req: EngineRequest, quant: str) -> Path:
    return req.work_dir.parent / "llamacpp" / f"model-{quant.lower()}.gguf"


def convert_f32(req: EngineRequest) -> Path:
    out = gguf_path(req, "F32")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        # without NO_LOCAL_GGUF the script imports the gguf-py beside it (module doc)
        env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
        subprocess.run([sys.executable, str(converter_script()), str(req.checkpoint),
                        "--outfile", str(tmp), "--outtype", "f32"], check=True, env=env)
        tmp.rename(out)
    return out


def quantize(req: EngineRequest, quant: str) -> Path:
    import ctypes

    import llama_cpp

    src, out = convert_f32(req), gguf_path(req, quant)
    if quant == "F32" or out.is_file():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant}")
    params.nthread = req.threads
    tmp = out.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(),
                                      ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize {quant} failed on {src}")
    tmp.rename(out)
    return out


def tensor_types(path: Path) -> dict[str, int]:
    """How many weight tensors of each GGUF type the file holds, and which type the
    output and embedding matrices have (llama.cpp's Q4_0 recipe keeps output at Q6_K)."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    special = {}
    for t in GGUFReader(path).tensors:
        kind = t.tensor_type.name
        counts[kind] = counts.get(kind, 0) + 1
        if t.name in ("output.weight", "token_embd.weight"):
            special[t.name] = kind
    return {**{f"count {k}": v for k, v in sorted(counts.items())}, **special}


def preparer(quant: str):
    def prepare(req: EngineRequest) -> None:
        path = quantize(req, quant)
        summary = path.with_suffix(".json")
        if not summary.is_file():
            summary.write_text(json.dumps(tensor_types(path), indent=1))
    return prepare


def loader(quant: str):
    def load(req: EngineRequest) -> Loaded:
        import llama_cpp
        import numpy as np

        path = gguf_path(req, quant)
        types = json.loads(path.with_suffix(".json").read_text())
        # llamacpp-f32 is the cross-check against Hugging Face: float32 KV cache too (the
        # default f16 cache alone made its greedy ids leave hf-eager's after 10 of 128 on
        # the 300m checkpoint); the quantized engines keep llama.cpp's default f16 cache
        kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} \
            if quant == "F32" else {}
        with _extra_buffer_types(os.environ.get("LLAMA_CPP_EXTRA_BUFTS", "1") != "0"):
            llm = llama_cpp.Llama(str(path), n_ctx=req.max_tokens, n_threads=req.threads,
                                  n_threads_batch=req.threads, verbose=False, **kv)
        n_vocab, eos = llm.n_vocab(), llm.token_eos()

        def generate(prompt, new_tokens, on_token):
            # greedy over the last logits with end of sequence masked (llama.cpp's
            # ignore_eos); the prompt is one batch (n_batch 512 >= 128)
            llm.reset()
            llm.eval(prompt)
            for step in range(new_tokens):
                logits = np.ctypeslib.as_array(
                    llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
                logits[eos] = -np.inf
                token = int(logits.argmax())
                on_token(token)
                if step + 1 < new_tokens:
                    llm.eval([token])

        extra = "" if os.environ.get("LLAMA_CPP_EXTRA_BUFTS", "1") != "0" else \
            ", extra buffer types off (no AMX, no repacking)"
        variant = (f"{quant}{extra} (output {types.get('output.weight')}, "
                   f"embeddings {types.get('token_embd.weight')})")
        kv_cache = "f32" if kv else "f16"
        return Loaded(generate, f"{variant}, KV {kv_cache}", [path],
                      notes=f"llama-cpp-python {llama_cpp.__version__}, flash_attn off "
                            "(its default), mmap")
    return load


@contextlib.contextmanager
def _extra_buffer_types(wanted: bool):
    """``LLAMA_CPP_EXTRA_BUFTS=0``: load without llama.cpp's extra weight buffer types
    (``use_extra_bufts``, which llama-cpp-python does not expose). Built with
    GGML_NATIVE on a CPU with AMX, its AMX buffer type runs ``tileloadd`` in
    ``supports_op`` with no tile configuration loaded: SIGILL on the first eval here."""
    import llama_cpp.llama_cpp as capi
    default = capi.llama_model_default_params
    if not wanted:
        def without():
            params = default()
            params.use_extra_bufts = False
            return params
        capi.llama_model_default_params = without
    try:
        yield
    finally:
        capi.llama_model_default_params = default


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="copy llama.cpp's GGUF converter out of "
                                                 "the llama-cpp-python sdist")
    parser.add_argument("--extract", type=Path, required=True, metavar="SDIST")
    print(extract_converter(parser.parse_args().extract))

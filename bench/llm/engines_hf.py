"""Hugging Face baselines: eager ``generate`` (DynamicCache), and the static-cache +
``torch.compile`` recipe from the transformers documentation ("Static cache and
torch.compile"): ``generation_config.cache_implementation = "static"`` and
``model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)``
(default mode on the CPU: "reduce-overhead" means CUDA graphs).
"""

from __future__ import annotations

from bench.llm.engine import EngineRequest, Loaded


def _load_model(req: EngineRequest):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(req.threads)
    model = AutoModelForCausalLM.from_pretrained(req.checkpoint, dtype=torch.float32)
    return model.to(req.device).eval()


def _generate_fn(model, device: str):
    """generate() under the protocol: greedy, exactly ``new_tokens`` (min_new_tokens masks
    the end of sequence), each new id handed to ``on_token`` through a streamer."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class OnToken(BaseStreamer):
        def __init__(self, on_token):
            self.on_token, self.seen_prompt = on_token, False

        def put(self, value):  # the first call carries the prompt, then one id per step
            if not self.seen_prompt:
                self.seen_prompt = True
                return
            self.on_token(int(value.reshape(-1)[0]))

        def end(self):
            pass

    def generate(prompt, new_tokens, on_token):
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           streamer=OnToken(on_token))

    return generate


def _files(req: EngineRequest) -> list:
    return sorted(req.checkpoint.glob("*.safetensors"))


def _gpu_peak(device: str):
    if device != "cuda":
        return None
    import torch

    return lambda: torch.cuda.max_memory_allocated() / 2**20


def load_eager(req: EngineRequest) -> Loaded:
    model = _load_model(req)
    return Loaded(_generate_fn(model, req.device), "fp32, DynamicCache", _files(req),
                  _gpu_peak(req.device))


def load_static_compile(req: EngineRequest) -> Loaded:
    import torch

    model = _load_model(req)
    model.generation_config.cache_implementation = "static"
    # compile as the recipe says and only that: transformers would otherwise also compile
    # __call__ on its own on a GPU when it sees a static cache
    model.generation_config.disable_compile = True
    mode = "reduce-overhead" if req.device == "cuda" else "default"
    model.forward = torch.compile(model.forward, mode=mode, fullgraph=True)
    return Loaded(_generate_fn(model, req.device),
                  f"fp32, StaticCache, torch.compile({mode})", _files(req),
                  _gpu_peak(req.device),
                  notes="compilation happens in the warm-up call (warmup_s)")

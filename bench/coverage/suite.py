"""The coverage suite: every model factory in bench/coverage/ with its family.

A ``Model``'s ``spec`` is the exporter spec string (``exporter build SPEC``), relative to
the repository root. ``needs="torchvision"`` marks gpu_only.py models (torchvision and
timm), which cannot be imported on the CPU machine. ``fast=True`` marks a handful of the
smallest models, one per family group, for a quick test slice.
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("cnn", "hybrid", "vit", "encoder", "decoder", "encoder-decoder", "dense", "audio",
            "multimodal")


@dataclass(frozen=True)
class Model:
    name: str
    spec: str  # bench/coverage/FILE.py:factory
    family: str  # one of FAMILIES
    needs: str = "any"  # "any" or "torchvision"
    fast: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: unknown family {self.family!r}")
        if self.needs not in ("any", "torchvision"):
            raise ValueError(f"{self.name}: unknown needs {self.needs!r}")


def _entries(file: str, family: str, *names: str, needs: str = "any",
             fast: tuple[str, ...] = ()) -> tuple[Model, ...]:
    """Models named after their factories in ``bench/coverage/FILE``."""
    return tuple(Model(name, f"bench/coverage/{file}:{name}", family, needs, name in fast)
                 for name in names)


SUITE: tuple[Model, ...] = (
    # vision.py: Hugging Face image classifiers
    *_entries("vision.py", "cnn", "resnet", "mobilenet_v1", "mobilenet_v2", "efficientnet",
              "convnext", "convnextv2", "regnet", "bit", fast=("resnet",)),
    *_entries("vision.py", "hybrid", "mobilevit", "mobilevitv2", "levit", "swiftformer",
              "poolformer", "cvt", "focalnet"),
    *_entries("vision.py", "vit", "vit", "deit", "beit", "dinov2", "swin", "swinv2", "pvt_v2",
              "hiera", fast=("vit",)),
    # encoders.py: text encoders, sequence classification
    *_entries("encoders.py", "encoder", "bert", "roberta", "xlm_roberta", "distilbert", "albert",
              "electra", "deberta", "deberta_v2", "modernbert", "mpnet", "mobilebert",
              "convbert", "roformer", "squeezebert", "funnel", "fnet", fast=("bert",)),
    # decoders.py: causal language models
    *_entries("decoders.py", "decoder", "llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3",
              "phi", "stablelm", "starcoder2", "olmo2", "gemma", "gemma2", "gemma3", "gpt2",
              "gpt_bigcode", "gptj", "gpt_neox", "opt", "bloom", "falcon", "mamba",
              fast=("llama",)),
    # other.py: seq2seq, dense prediction, audio, image-text
    *_entries("other.py", "encoder-decoder", "t5", "bart", "marian", "pegasus", "whisper",
              fast=("t5",)),
    *_entries("other.py", "dense", "detr", "yolos", "segformer", "dpt", "mobilevit_deeplabv3",
              "mobilenetv2_deeplabv3"),
    *_entries("other.py", "audio", "wav2vec2", "hubert", "wavlm", "ast", fast=("wav2vec2",)),
    *_entries("other.py", "multimodal", "clip", "siglip"),
    # gpu_only.py: torchvision and timm (the GPU machine has them)
    *_entries("gpu_only.py", "cnn", "tv_resnet18", "tv_mobilenet_v3_small",
              "tv_shufflenet_v2_x0_5", "tv_densenet121", "tv_inception_v3", "tv_efficientnet_b0",
              "timm_ghostnet_100", "timm_convnext_atto", "timm_regnetx_002",
              "timm_mobilenetv4_conv_small", needs="torchvision"),
    *_entries("gpu_only.py", "dense", "tv_deeplabv3_mobilenet_v3_large", needs="torchvision"),
    *_entries("gpu_only.py", "hybrid", "timm_fastvit_t8", "timm_maxvit_pico",
              "timm_efficientformer_l1", "timm_levit_128s", "timm_efficientvit_b0",
              needs="torchvision"),
)


def select(names: list[str] | None, machine_has_torchvision: bool) -> list[Model]:
    """The models named (all when ``names`` is None or empty), in suite order, less those
    that need torchvision on a machine without it. An unknown name is a ValueError."""
    by_name = {m.name: m for m in SUITE}
    unknown = [n for n in names or () if n not in by_name]
    if unknown:
        raise ValueError(f"no coverage model named {', '.join(unknown)}; "
                         f"known: {', '.join(by_name)}")
    wanted = set(names) if names else set(by_name)
    return [m for m in SUITE if m.name in wanted
            and (machine_has_torchvision or m.needs != "torchvision")]

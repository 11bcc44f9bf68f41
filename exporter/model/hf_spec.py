"""``hf:PATH``: a local Hugging Face ``transformers`` checkpoint as a model spec.

PATH is a folder with ``config.json`` and ``model.safetensors``; nothing is downloaded
(``local_files_only``, and ``HF_HUB_OFFLINE=1`` while it loads; the caller's setting
after). A build never validates against weights the user did not give: a folder
without weights, or a checkpoint that leaves any weight of the chosen task's model
newly initialised (a ``causal-lm`` head on a BERT classifier), is refused unless ``--random-weights`` asks for
random weights explicitly (how architecture trials use it; loudly warned). ``--task`` picks the model class and what the artifact
returns; by default it is read from the config's ``architectures``:

    feature-extraction    AutoModel                            -> last_hidden_state
    text-classification   AutoModelForSequenceClassification   -> logits
    causal-lm             AutoModelForCausalLM (no KV cache)   -> logits
    image-classification  AutoModelForImageClassification      -> logits

The artifact's one output keeps the field's name (``logits``), and the manifest records
the task and the real model class. Example inputs follow the modality (for
feature-extraction, the model's own ``main_input_name``; audio inputs are refused): ``input_ids``
(int64, random ids below the vocab size) and ``attention_mask`` of ``--seq-len`` tokens
(default min(128, the model's maximum positions)), or ``pixel_values`` (float32,
``--image-size``, default the config's) for images, ``--batch-size`` of them (default 1),
static shapes. ``--dynamic batch=1..8`` or ``sequence=8..128`` (or one input's dim, e.g.
``input_ids:0=1..8``) makes that dim dynamic in every input that shares it; examples are
then made again at size 2 or more there (exporter/model/example_dims.py), since
torch.export makes a dim whose example is 0 or 1 a constant. A new task is one row of
``TASKS``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from exporter.errors import SpecError
from exporter.model.hf_limits import check_config_size, first_lines, read_config
from exporter.model.hf_weights import check_index, from_checkpoint, from_config
from passes.graph.torch_warnings import loggers_quiet

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Task:
    auto_class: str  # the transformers Auto class that builds the model
    output: str  # the field of the model's output the artifact returns, and its name
    modality: str = "text"  # the example inputs: "text" (input_ids, attention_mask) or "image"


TASKS = {
    "feature-extraction": Task("AutoModel", "last_hidden_state"),
    "text-classification": Task("AutoModelForSequenceClassification", "logits"),
    "causal-lm": Task("AutoModelForCausalLM", "logits"),
    # prefill + decode over a KV cache: built by exporter/lm/ (load_pretrained), not load_hf
    "text-generation": Task("AutoModelForCausalLM", "logits", "generation"),
    "image-classification": Task("AutoModelForImageClassification", "logits", "image"),
}
# architectures' name endings -> task, for the default
_ARCHITECTURE_TASKS = (("ForSequenceClassification", "text-classification"),
                       ("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"),
                       ("ForImageClassification", "image-classification"))


@dataclass(frozen=True)
class HfOptions:
    task: str | None = None
    seq_len: int | None = None
    image_size: int | None = None
    random_weights: bool = False  # build even where the checkpoint has no weights
    trust_remote_code: bool = False  # the checkpoint's own .py files may run (auto_map)
    max_model_size: int | None = None  # float32 weight bytes; None: half the memory
    batch_size: int | None = None  # the example inputs' batch; None: 1

    @classmethod
    def from_settings(cls, settings) -> "HfOptions":
        """From BuildSettings, or the settings dict a manifest recorded."""
        get = settings.get if isinstance(settings, dict) else lambda k, d=None: getattr(
            settings, k, d)
        return cls(get("task"), get("seq_len"), get("image_size"),
                   bool(get("random_weights", False)), bool(get("trust_remote_code", False)),
                   get("max_model_size"), get("batch_size"))


@dataclass
class HfModel:
    """What ``load_hf`` built: the module to export, its example args, warnings, and what
    was chosen (for the manifest and the build's summary)."""
    module: torch.nn.Module
    args: tuple
    notes: list[str]
    output: str  # the artifact's output name: the task's field (logits, last_hidden_state)
    details: dict  # task, model_class (BertForSequenceClassification), seq_len or image_size
    # dims every input shares ("batch" -> input_ids:0, attention_mask:0) and the example
    # args at other sizes of them ({"batch": 2} -> args)
    groups: dict[str, tuple[tuple[str, int], ...]]
    remake: Callable[[dict[str, int]], tuple]


class TextOutput(torch.nn.Module):
    """Calls the model by keyword and returns the task's one output (HF models take other
    arguments positionally, and return dataclasses with optional fields)."""

    user_model_attribute = "model"  # exporter/model/capture.py: module paths as the user's

    def __init__(self, model: torch.nn.Module, output: str) -> None:
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask),
                       self.output)


class ImageOutput(TextOutput):
    """``resize``: the images are not the size the model was configured for; vision
    transformers then interpolate their position embeddings (``--image-size``)."""

    def __init__(self, model: torch.nn.Module, output: str, resize: bool = False) -> None:
        super().__init__(model, output)
        self.extra = {"interpolate_pos_encoding": True} if resize else {}

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return getattr(self.model(pixel_values=pixel_values, **self.extra), self.output)


def load_hf(text: str, path_text: str, options: HfOptions) -> HfModel:
    """The model of ``hf:PATH``, wrapped to take its inputs by name and return one tensor."""
    model, config, name, warnings = load_pretrained(text, path_text, options)
    task = TASKS[name]
    if task.modality == "generation" and options.task is None:  # from the config
        raise SpecError(f"{type(model).__name__} is an encoder-decoder: it builds as a "
                        "generating artifact (encode, prefill, decode), not one forward",
                        where=text, hint="add --task text-generation")
    if task.modality == "generation":
        raise SpecError("--task text-generation builds through exporter.lm, not load_hf",
                        where=text)
    details = {"task": name, "model_class": type(model).__name__,
               "batch_size": options.batch_size or 1}
    if _modality(task, model, text) == "text":
        seq_len = _seq_len(config, options)
        remake = functools.partial(_text_args, getattr(config, "vocab_size", None) or 2,
                                   {"batch": details["batch_size"], "sequence": seq_len})
        groups = {"batch": (("input_ids", 0), ("attention_mask", 0)),
                  "sequence": (("input_ids", 1), ("attention_mask", 1))}
        return HfModel(TextOutput(model.eval(), task.output).eval(), remake({}), warnings,
                       task.output, {**details, "seq_len": seq_len}, groups, remake)
    size = options.image_size or getattr(config, "image_size", None) or 224
    resize = size != getattr(config, "image_size", size)
    if resize and "interpolate_pos_encoding" not in inspect.signature(model.forward).parameters:
        raise SpecError(f"this model takes {config.image_size}-pixel images; --image-size "
                        f"{size} needs a model that can resize", where=text,
                        hint=f"drop --image-size or give {config.image_size}")
    remake = functools.partial(_image_args, (getattr(config, "num_channels", 3), size, size),
                               {"batch": details["batch_size"]})
    module = ImageOutput(model.eval(), task.output, resize).eval()
    return HfModel(module, remake({}), warnings, task.output, {**details, "image_size": size},
                   {"batch": (("pixel_values", 0),)}, remake)


# transformers' main_input_name -> the example inputs made
_MODALITIES = {"input_ids": "text", "pixel_values": "image"}
_FACTORY = ("from a factory file that returns the model and its example inputs (README: "
            "Naming a model)")


def _modality(task: Task, model: torch.nn.Module, text: str) -> str:
    """Text or image examples, as the model takes them (AutoModel: a backbone or encoder)."""
    main = getattr(model, "main_input_name", None) or "input_ids"
    if main not in _MODALITIES:  # input_values, input_features: audio
        raise SpecError(f"{type(model).__name__} takes {main}; hf: specs make examples of "
                        "input_ids (text) or pixel_values (images) only", where=text,
                        hint=f"build it {_FACTORY}")
    return _MODALITIES[main] if task is TASKS["feature-extraction"] else task.modality


def load_pretrained(text: str, path_text: str, options: HfOptions) -> tuple:
    """``(model, config, task name, warnings)``: the checkpoint's transformers model for the
    task (``--task`` or the config's architectures), its weights checked (``_model``)."""
    with offline():
        return _load_pretrained(text, path_text, options)


def _load_pretrained(text: str, path_text: str, options: HfOptions) -> tuple:
    try:
        import transformers
    except ImportError:
        from targets.card import install_command
        raise SpecError("hf: specs need the 'transformers' package", where=text,
                        hint=install_command("hf")) from None
    path = Path(path_text).expanduser()
    config, raw = _config(transformers, path, text, options)
    name = options.task or _task_from(config)
    if name not in TASKS:
        raise SpecError(f"unknown --task {name!r}", where=text,
                        hint=f"use one of {', '.join(TASKS)}")
    auto_class = getattr(transformers, _auto_class(transformers, TASKS[name], config))
    _check_head(auto_class, config, name, text, options)
    with _quiet_transformers(transformers):
        if not options.trust_remote_code:  # remote code is sized by running it: not here
            check_config_size(config, auto_class, options.max_model_size, text, raw)
        model, warnings = _model(auto_class, config, path, text, name, options)
    return model.eval(), config, name, _remote_code_notes(raw, config, options) + warnings


def _check_head(auto_class, config, task: str, text: str, options: HfOptions) -> None:
    """Refused naming the task and config.json's architectures (UperNet under AutoModel)."""
    mapping = getattr(auto_class, "_model_mapping", None)
    if options.trust_remote_code or mapping is None or type(config) in mapping:
        return
    named = ", ".join(getattr(config, "architectures", None) or []) or "none named"
    raise SpecError(f"transformers' {auto_class.__name__} (--task {task}) has no class for "
                    f"{type(config).__name__}; config.json's architectures: {named}",
                    where=text, hint=f"give the --task of that head ({', '.join(TASKS)}), or "
                    f"build it {_FACTORY}")


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Never the network, whatever the caller's environment asks, while a checkpoint
    loads: ``HF_HUB_OFFLINE=1`` and huggingface_hub's own flag, which it reads from the
    environment once, when first imported. Both are the caller's again after: a Python
    caller's later ``from_pretrained`` downloads if their settings let it."""
    try:  # imported before the variable is set: its flag starts as the caller's
        from huggingface_hub import constants
    except ImportError:
        constants = None
    had = os.environ.get("HF_HUB_OFFLINE")
    flag = getattr(constants, "HF_HUB_OFFLINE", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if had is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = had
        if constants is not None:
            constants.HF_HUB_OFFLINE = flag


def _auto_class(transformers, task: Task, config) -> str:
    """The task's Auto class; text generation from an encoder-decoder checkpoint (Whisper,
    BART, Marian, ...) takes its sequence-to-sequence class (exporter/lm/seq2seq.py)."""
    if task.modality != "generation" or not getattr(config, "is_encoder_decoder", False):
        return task.auto_class
    speech = transformers.AutoModelForSpeechSeq2Seq._model_mapping
    return ("AutoModelForSpeechSeq2Seq" if type(config) in speech
            else "AutoModelForSeq2SeqLM")


def _config(transformers, path: Path, text: str, options: HfOptions):
    if path.is_file():
        raise SpecError(f"{path} is a file; hf: takes the checkpoint's folder", where=text,
                        hint=f"give hf:{path.parent} (the folder that holds config.json)")
    if not (path / "config.json").is_file():
        raise SpecError(f"{path} is not a Hugging Face checkpoint folder (no config.json)",
                        where=text, hint="give a folder written by save_pretrained()")
    raw = read_config(path / "config.json", text)  # sizes checked before transformers
    try:
        # trust_remote_code=False always unless asked: a checkpoint folder's own .py files
        # (config.json's auto_map) never run, and transformers never prompts on stdin.
        config = transformers.AutoConfig.from_pretrained(
            path, local_files_only=True, trust_remote_code=options.trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers' own checks of the user's file
        remote = "custom code" in str(exc)
        raise SpecError(f"transformers cannot read {path / 'config.json'} "
                        f"({type(exc).__name__}: {first_lines(exc)})",
                        where=text, hint="the folder's own Python code (config.json's "
                        "auto_map) runs only with --trust-remote-code: read it first"
                        if remote else "check the config's model_type and sizes") from None
    return config, raw


def _remote_code_notes(raw: dict, config, options: HfOptions) -> list[str]:
    """Said where config.json names the folder's own code (auto_map) and transformers' stock
    class was used instead: the model built may not be the one the folder's author meant."""
    if options.trust_remote_code or not raw.get("auto_map"):
        return []
    named = raw["auto_map"]
    shown = ", ".join(f"{k}: {v}" for k, v in list(named.items())[:3]) if isinstance(
        named, dict) else str(named)[:120]
    note = (f"config.json's auto_map names the folder's own code ({shown}); it was not run: "
            f"transformers' stock classes for model_type {getattr(config, 'model_type', '?')!r} "
            f"({type(config).__name__}) were used instead "
            "(--trust-remote-code would run the folder's code: read it first)")
    return [note]


@contextlib.contextmanager
def _quiet_transformers(transformers) -> Iterator[None]:
    """transformers draws a "Loading weights" bar and logs a load report (keys missing or
    unused) while it builds the model; the build has its own stage line and says itself
    what matters (weights left random: refused or warned), so both show only with
    --verbose (our loggers at DEBUG)."""
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    hf_logging = transformers.utils.logging
    bar, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    # building the model imports torchao, which logs the CUDA kernels a CPU machine cannot
    # load and torch's pytree deprecations (the CLI hides them; the API did not)
    try:
        with loggers_quiet("torchao", "torch.utils._pytree"):
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _task_from(config) -> str:
    if getattr(config, "is_encoder_decoder", False):  # Whisper, BART, T5, Marian...: they
        return "text-generation"  # generate (exporter/lm/seq2seq.py); a plain forward needs
    for architecture in getattr(config, "architectures", None) or []:  # decoder inputs
        for ending, task in _ARCHITECTURE_TASKS:
            if architecture.endswith(ending):
                return task
    return "feature-extraction"


def _model(auto_class, config, path: Path, text: str, task: str, options: HfOptions):
    random_weights = options.random_weights
    if task == "causal-lm":
        config.use_cache = False  # no past_key_values among the outputs
    weights = [p for p in ("model.safetensors", "model.safetensors.index.json")
               if (path / p).is_file()]
    if "model.safetensors.index.json" in weights:
        check_index(path / "model.safetensors.index.json", text)
    if not weights and not random_weights:
        pickled = sorted(p.name for p in path.glob("*.bin"))
        raise SpecError(f"{path} has no model.safetensors"
                        + (f" (only {', '.join(pickled)}, a pickle this tool never loads: "
                           "unpickling runs code)" if pickled else "")
                        + ": the build would validate random weights, not yours", where=text,
                        hint=("convert it where you trust the file: python -c \"import "
                              f"transformers as t; m = t.AutoModel.from_pretrained('{path}'); "
                              f"m.save_pretrained('{path}', safe_serialization=True)\" (use the "
                              "task's class), or pass" if pickled else
                              "save the model's weights there (model.save_pretrained(folder)), "
                              "or pass") + " --random-weights for an architecture trial on purpose")
    if weights:
        model, info = from_checkpoint(auto_class, config, path, text, options.trust_remote_code)
        return model, _newly_initialised(info, path, text, task, random_weights)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is theirs
        torch.manual_seed(0)
        model = from_config(auto_class, config, text, options.trust_remote_code)
    return model, [f"{path} has no model.safetensors: built with random weights (seed 0, "
                   "--random-weights); the artifact computes what those weights compute"]


def _newly_initialised(info: dict, path: Path, text: str, task: str,
                       random_weights: bool) -> list[str]:
    """Refuse (or, with --random-weights, warn about) weights the task's model has and the
    checkpoint does not: transformers initialises them at random, silently."""
    missing = sorted(info.get("missing_keys") or [])
    if not missing:
        return []
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    if random_weights:
        return [f"{len(missing)} weight(s) of the {task} model are not in {path} and were "
                f"initialised at random (--random-weights): {shown}"]
    raise SpecError(f"the checkpoint has no weights for {len(missing)} parameter(s) the "
                    f"{task} model needs ({shown}); transformers would initialise them at "
                    "random and validation would prove nothing", where=text,
                    hint="pick the --task the checkpoint was saved for (its config's "
                         "architectures), or pass --random-weights to build with those "
                         "weights random on purpose")


def _seq_len(config, options: HfOptions) -> int:
    limit = getattr(config, "max_position_embeddings", None)
    limit = limit if isinstance(limit, int) and limit > 0 else None  # XLNet's -1: no limit
    seq_len = options.seq_len or min(128, limit or 128)
    if limit is not None and seq_len > limit:
        raise SpecError(f"--seq-len {seq_len} is over the model's {limit} positions",
                        hint=f"give --seq-len {limit} or less")
    return seq_len


def _text_args(vocab: int, default: dict[str, int], sizes: dict[str, int]) -> tuple:
    """input_ids (seeded random ids) and an all-ones attention_mask, [batch, sequence]."""
    shape = (sizes.get("batch", default["batch"]), sizes.get("sequence", default["sequence"]))
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, shape, generator=generator),
            torch.ones(shape, dtype=torch.int64))


def _image_args(image: tuple[int, int, int], default: dict[str, int],
                sizes: dict[str, int]) -> tuple:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(sizes.get("batch", default["batch"]), *image, generator=generator),)

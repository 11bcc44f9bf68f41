"""``hf:PATH`` specs: a local Hugging Face checkpoint (config, safetensors) built with the
task's model class and example inputs of its modality; no network."""

from __future__ import annotations

import json

import pytest
import torch

import runtime

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Three tiny checkpoints written by save_pretrained: a BERT classifier with weights, a
    GPT-2 config alone (random weights), a ViT classifier config alone."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, num_labels=3)).eval()
    bert.save_pretrained(root / "bert", safe_serialization=True)
    transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                            architectures=["GPT2LMHeadModel"]).save_pretrained(root / "gpt2")
    transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64, num_labels=5,
                           architectures=["ViTForImageClassification"]).save_pretrained(root / "vit")
    return root, bert


def test_text_classification_checkpoint_builds_and_matches_transformers(checkpoints, cli_here):
    """As a newcomer runs it, from the checkpoint's parent folder with no flags but the
    target: a clean default name, the task and shapes said, the output named `logits`."""
    root, bert = checkpoints
    result = cli_here("build", "hf:./bert", "--target", "onnx", "--seq-len", "16", cwd=root)
    assert result.returncode == 0, result.stderr
    assert "validation: PASSED" in result.stdout
    assert ("model: BertForSequenceClassification, task text-classification (--task); "
            "example inputs: batch 1, sequence 16, static") in result.stdout
    assert "Loading weights" not in result.stderr  # transformers' bar: --verbose only
    out = root / "bert-onnx.artifact"
    manifest = runtime.read_manifest(out)
    assert [(s.name, s.dtype, [d.size for d in s.shape]) for s in manifest.signature.inputs] == \
        [("input_ids", "int64", [1, 16]), ("attention_mask", "int64", [1, 16])]
    assert [s.name for s in manifest.signature.outputs] == ["logits"]
    assert manifest.source == {"spec": "hf:./bert", "task": "text-classification",
                               "model_class": "BertForSequenceClassification", "seq_len": 16,
                               "batch_size": 1}
    assert manifest.build["settings"]["task"] == "text-classification"  # chosen, recorded
    program = runtime.load(out)
    assert "outputs=[logits: float32[1, 3]]" in repr(program)
    ids = torch.randint(0, 100, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    with torch.no_grad():
        expected = bert(input_ids=ids, attention_mask=mask).logits  # the saved weights
    torch.testing.assert_close(program(ids, mask), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("source, stem", [("hf:./tiny-bert", "tiny-bert"),
                                          ("hf:/tmp/u/tiny-bert/", "tiny-bert"),
                                          ("hf:.", "{cwd}"), ("models/net.py:make", "net")])
def test_default_artifact_names_are_clean(source, stem, tmp_path, monkeypatch):
    from exporter.model.spec_names import default_stem

    monkeypatch.chdir(tmp_path)
    assert default_stem(source) == stem.format(cwd=tmp_path.name)


@pytest.mark.parametrize("folder, flags, inputs, output, warned", [
    ("gpt2", ["--random-weights"],
     [("input_ids", "int64", [1, 64]), ("attention_mask", "int64", [1, 64])],
     ("logits", [1, 64, 100]), True),
    ("vit", ["--image-size", "48", "--random-weights"],
     [("pixel_values", "float32", [1, 3, 48, 48])], ("logits", [1, 5]), True),
    ("bert", ["--task", "feature-extraction", "--seq-len", "8"],
     [("input_ids", "int64", [1, 8]), ("attention_mask", "int64", [1, 8])],
     ("last_hidden_state", [1, 8, 32]), False),
    ("vit", ["--batch-size", "3", "--random-weights"],
     [("pixel_values", "float32", [3, 3, 32, 32])], ("logits", [3, 5]), True),
], ids=["causal-lm-from-architectures", "image-classification", "feature-extraction-by-task",
        "image-batch-size"])
def test_tasks_choose_the_class_and_the_inputs(checkpoints, cli_here, folder, flags, inputs, output,
                                               warned):
    root, _ = checkpoints
    result = cli_here("build", f"hf:{root / folder}", "--target", "onnx", "--dry-run", "--json",
                      *flags)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    signature = data["signature"]
    assert [(t["name"], t["dtype"], t["shape"]) for t in signature["inputs"]] == inputs
    assert [(signature["outputs"][0]["name"], signature["outputs"][0]["shape"])] == [output]
    assert any("random weights" in w for w in data["warnings"]) == warned


def test_dynamic_batch_from_one_input_dim_builds_for_every_input(checkpoints, cli_here):
    """`--dynamic input_ids:0=1..4` on batch-1 examples: the mask's batch follows, examples
    are made at batch 2 to trace, and the artifact takes batch 1 and 3 and short texts."""
    root, bert = checkpoints
    out = root / "bert-dynamic.artifact"
    result = cli_here("build", f"hf:{root / 'bert'}", "--target", "onnx", "--seq-len", "16",
                      "--dynamic", "input_ids:0=1..4", "--dynamic", "sequence=1..32",
                      "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert ("example inputs: batch 2 (dynamic 1..4), sequence 16 (dynamic 1..32)"
            in result.stdout)
    assert "static" not in result.stdout.split("example inputs:")[1].splitlines()[0]
    manifest = runtime.read_manifest(out)
    assert [[(d.symbol, d.min, d.max) for d in s.shape] for s in manifest.signature.inputs] == \
        [[("batch", 1, 4), ("sequence", 1, 32)]] * 2
    program = runtime.load(out)
    for batch, length in ((1, 3), (3, 32)):
        ids = torch.randint(0, 100, (batch, length))
        mask = torch.ones(batch, length, dtype=torch.int64)
        with torch.no_grad():
            expected = bert(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(program(ids, mask), expected, rtol=1e-4, atol=1e-5)


def test_hf_mistakes_are_usage_errors(checkpoints, cli_here, tmp_path):
    root, _ = checkpoints
    missing = cli_here("build", f"hf:{tmp_path / 'nope'}", "--dry-run")
    assert missing.returncode == 2 and "no config.json" in missing.stderr
    bad_task = cli_here("build", f"hf:{root / 'bert'}", "--task", "translation", "--dry-run")
    assert bad_task.returncode == 2 and "--task" in bad_task.stderr
    not_hf = cli_here("build", "zoo:mlp", "--task", "causal-lm", "--dry-run")
    assert not_hf.returncode == 2 and "apply to hf:PATH specs only" in not_hf.stderr
    for result in (missing, bad_task, not_hf):
        assert "Traceback" not in result.stderr


def test_weights_the_user_did_not_give_are_refused(checkpoints, cli_here):
    """A task head the checkpoint lacks, or no weights at all, would validate random weights:
    exit 2 naming what is missing, unless --random-weights asks for it."""
    root, _ = checkpoints
    head = cli_here("build", f"hf:{root / 'bert'}", "--task", "causal-lm", "--dry-run")
    assert head.returncode == 2, head.stderr
    assert "cls.predictions" in head.stderr and "--random-weights" in head.stderr
    bare = cli_here("build", f"hf:{root / 'gpt2'}", "--dry-run")
    assert bare.returncode == 2 and "no model.safetensors" in bare.stderr
    # nothing to convert: the hint says where weights come from, not how to convert them
    assert "save_pretrained(folder)" in bare.stderr and "from_pretrained" not in bare.stderr
    allowed = cli_here("build", f"hf:{root / 'bert'}", "--task", "causal-lm", "--random-weights",
                       "--dry-run", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert any("initialised at random" in w for w in json.loads(allowed.stdout)["warnings"])
    # ours says it; transformers' own load report and advice show only with --verbose
    assert "[transformers]" not in allowed.stderr and "LOAD REPORT" not in allowed.stderr


def test_damaged_checkpoint_files_are_usage_errors_naming_the_file(checkpoints, cli_here, tmp_path):
    """A truncated model.safetensors, a config.json that is not JSON, a path to the config
    file instead of its folder: the user's files, exit 2 naming them, not an internal
    error (exit 4, "a bug in the exporter")."""
    import shutil
    root, _ = checkpoints
    cut = shutil.copytree(root / "bert", tmp_path / "cut")
    with open(cut / "model.safetensors", "r+b") as weights:
        weights.truncate(1000)
    garbled = shutil.copytree(root / "bert", tmp_path / "garbled")
    (garbled / "config.json").write_text("{ not json")
    for spec, said in ((f"hf:{cut}", "a safetensors file is damaged or incomplete"),
                       (f"hf:{garbled}", "not valid JSON"),
                       (f"hf:{root / 'bert' / 'config.json'}", "hf: takes the checkpoint's folder")):
        done = cli_here("build", spec, "--target", "onnx", "--dry-run")
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "bug in the exporter" not in done.stderr


def test_torchaos_import_chatter_is_quiet_while_the_model_builds_and_levels_come_back():
    """transformers imports torchao as it builds a model, and torchao logs CUDA kernels a
    CPU machine cannot load: the API printed them with every hf: build."""
    import logging

    from exporter.model.hf_spec import _quiet_transformers
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    keep, loggers = Keep(), [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    before = [logger.level for logger in loggers]  # an in-process CLI run may have set them
    logging.getLogger().addHandler(keep)
    try:
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
        with _quiet_transformers(transformers):
            logging.getLogger("torchao.kernel").warning("Failed to load _C_mxfp8")
            logging.getLogger("torch.utils._pytree").warning("Enum subclass")
        logging.getLogger("torchao.kernel").warning("after")
    finally:
        logging.getLogger().removeHandler(keep)
        for logger, level in zip(loggers, before):
            logger.setLevel(level)
    assert seen == ["after"]


def test_random_weights_are_seeded_without_touching_the_callers_random_state(checkpoints):
    """Built from seed 0 each time (so `exporter validate` rebuilds the same model), in a
    forked random state: the Python caller's own draws go on as if nothing happened."""
    from exporter.model.hf_spec import HfOptions, load_pretrained
    root, _ = checkpoints
    options = HfOptions(task="causal-lm", random_weights=True)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    first = load_pretrained(f"hf:{root / 'gpt2'}", str(root / "gpt2"), options)[0]
    assert torch.equal(torch.random.get_rng_state(), state)
    again = load_pretrained(f"hf:{root / 'gpt2'}", str(root / "gpt2"), options)[0]
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                 again.state_dict().values()))


def test_a_model_without_a_position_limit_gets_the_default_length(tmp_path):
    """XLNet's config says ``max_position_embeddings == -1`` ("no sequence length
    limit"): the default length came out -1 and the example inputs crashed (exit 4)."""
    from exporter.model.hf_spec import HfOptions
    from exporter.model.spec import load_spec
    transformers.XLNetConfig(vocab_size=50, d_model=16, n_layer=1, n_head=2, d_inner=32,
                             architectures=["XLNetForSequenceClassification"]
                             ).save_pretrained(tmp_path / "xlnet")
    spec = load_spec(f"hf:{tmp_path / 'xlnet'}", HfOptions(random_weights=True))
    assert spec.details["seq_len"] == 128 and spec.args[0].shape == (1, 128)
    longer = load_spec(f"hf:{tmp_path / 'xlnet'}", HfOptions(random_weights=True, seq_len=300))
    assert longer.args[0].shape == (1, 300)


def test_a_vision_backbone_gets_images_and_an_audio_model_is_refused(tmp_path):
    """Feature extraction built every AutoModel with input_ids: a VitDet backbone failed
    at capture ("You have to specify pixel_values"), a SEW speech model with a TypeError."""
    from exporter.errors import SpecError
    from exporter.model.hf_spec import HfOptions
    from exporter.model.spec import load_spec
    transformers.VitDetConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, pretrain_image_size=32, patch_size=8
                              ).save_pretrained(tmp_path / "vitdet")
    spec = load_spec(f"hf:{tmp_path / 'vitdet'}", HfOptions(random_weights=True))
    assert spec.args[0].shape == (1, 3, 32, 32) and spec.details["image_size"] == 32
    transformers.SEWConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32).save_pretrained(tmp_path / "sew")
    with pytest.raises(SpecError, match="takes input_values"):
        load_spec(f"hf:{tmp_path / 'sew'}", HfOptions(random_weights=True))


def test_a_model_type_the_tasks_auto_class_lacks_is_refused_naming_its_architectures(tmp_path):
    """UperNet under feature extraction: transformers' AutoModel refused it with a list of
    every config class it knows; the refusal names the task and the checkpoint's head."""
    from exporter.errors import SpecError
    from exporter.model.hf_spec import HfOptions
    from exporter.model.spec import load_spec
    backbone = transformers.ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                           out_features=["stage1", "stage2", "stage3", "stage4"])
    transformers.UperNetConfig(backbone_config=backbone, hidden_size=16,
                               architectures=["UperNetForSemanticSegmentation"]
                               ).save_pretrained(tmp_path / "upernet")
    with pytest.raises(SpecError, match="no class for UperNetConfig.*"
                                        "UperNetForSemanticSegmentation"):
        load_spec(f"hf:{tmp_path / 'upernet'}", HfOptions(random_weights=True))

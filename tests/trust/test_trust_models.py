"""Hostile or careless model sources. An hf: folder's own code never runs, its weights
are never unpickled or swapped for random ones, its config cannot make the build allocate
without bound, and a factory cannot fake a successful build."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")


def _clean(result, code, *needles):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-trust")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64))
    model.save_pretrained(root / "bert", safe_serialization=True)
    return root / "bert"


@pytest.fixture(scope="module")
def hf_folders(bert_folder, tmp_path_factory):
    """bert (weights), llama (weights, generates), whisper (an encoder-decoder's config) and
    llava (nested text and vision configs), the last two without weights."""
    root = tmp_path_factory.mktemp("hf-sizes")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    ).save_pretrained(root / "llama")
    transformers.WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=24,
        max_target_positions=32).save_pretrained(root / "whisper")
    transformers.LlavaConfig(
        text_config=transformers.LlamaConfig(vocab_size=100, hidden_size=32,
                                             num_hidden_layers=1, num_attention_heads=4,
                                             intermediate_size=64),
        vision_config=transformers.CLIPVisionConfig(hidden_size=32, num_hidden_layers=1,
                                                    num_attention_heads=2,
                                                    intermediate_size=64, image_size=32,
                                                    patch_size=8)).save_pretrained(root / "llava")
    return {"bert": bert_folder, **{name: root / name for name in ("llama", "whisper", "llava")}}


def _copy(folder, tmp_path, name="ckpt"):
    return shutil.copytree(folder, tmp_path / name)


def _changed(folder, tmp_path, change: dict):
    """A copy of ``folder`` whose config.json has ``change`` merged in (tables merged)."""
    copy = _copy(folder, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    return copy


# --- a checkpoint's own Python code never runs without --trust-remote-code --------------

@pytest.mark.parametrize("model_type", ["bert", "evilbert"],
                         ids=["known-type", "only-the-folder-code-knows-it"])
def test_auto_map_code_never_runs_and_never_prompts(bert_folder, tmp_path, model_type):
    folder = _copy(bert_folder, tmp_path)
    marker = tmp_path / "PWNED"
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import BertConfig\nclass EvilConfig(BertConfig):\n    pass\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilConfig"}
    config["model_type"] = model_type
    (folder / "config.json").write_text(json.dumps(config))
    import subprocess
    import sys
    from tests.conftest import ROOT
    result = subprocess.run([sys.executable, "-m", "exporter", "build", f"hf:{folder}",
                             "--target", "onnx", "--seq-len", "8", "--json",
                             "--out", str(tmp_path / "x.artifact")], input="y\ny\n",
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert not marker.exists(), "the folder's evil.py was imported"
    assert "[y/N]" not in result.stdout + result.stderr
    json.loads(result.stdout)  # stdout is the JSON object alone
    if model_type == "bert":  # transformers' own class for the type; the auto_map is ignored
        assert result.returncode == 0, result.stderr
    else:
        _clean(result, 2, "--trust-remote-code")


# --- weights are safetensors from the folder, or refused ---------------------------------

def test_pytorch_model_bin_alone_is_refused_and_never_unpickled(bert_folder, tmp_path, cli_here):
    folder = _copy(bert_folder, tmp_path)
    marker = tmp_path / "UNPICKLED"

    class Payload:  # what a hostile pytorch_model.bin does when unpickled
        def __reduce__(self):
            return (open, (str(marker), "w"))
    (folder / "model.safetensors").unlink()
    import pickle
    with open(folder / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"payload": Payload()}, fh)
    result = cli_here("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8")
    _clean(result, 2, "model.safetensors", "safe_serialization=True")
    assert not marker.exists(), "pytorch_model.bin was unpickled"


def test_index_pointing_outside_the_folder_is_refused(bert_folder, tmp_path, cli_here):
    folder = _copy(bert_folder, tmp_path)
    (folder / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    names = list(__import__("safetensors").safe_open(
        tmp_path / "elsewhere.safetensors", "pt").keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: "../elsewhere.safetensors" for n in names}}))
    _clean(cli_here("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8"), 2,
           "outside its folder")


# --- hostile config sizes are refused before anything is allocated -----------------------

# True: a build that got past the check would allocate gigabytes, so it runs in a process
# of its own; the shapes that cannot be built at all run in this one
@pytest.mark.parametrize("change, needle, allocates", [
    ({"vocab_size": 10**9}, "GiB", True),
    ({"num_hidden_layers": 100_000}, "layers", True),
    ({"num_attention_heads": 0}, "num_attention_heads = 0 (zero)", False),
    ({"hidden_size": -32}, "hidden_size = -32 (negative)", False),
    ({"hidden_size": 30, "num_attention_heads": 4}, "not a multiple of num_attention_heads",
     False),
], ids=["vocab-1e9", "100k-layers", "0-heads", "negative-size", "heads-do-not-divide"])
def test_hostile_config_sizes_are_exit_2_quickly(bert_folder, tmp_path, cli, cli_here, change,
                                                 needle, allocates):
    import time
    cli = cli if allocates else cli_here
    folder = _copy(bert_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    result = cli("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8",
                 "--random-weights")
    _clean(result, 2, needle)
    # the command's start is seconds; building a 1e9-row table would be minutes, or killed
    assert time.perf_counter() - start < 120, "refused only after allocating"


def test_the_size_limit_is_overridable_both_ways(bert_folder, tmp_path, cli_here):
    small = cli_here("build", f"hf:{bert_folder}", "--target", "onnx", "--seq-len", "8",
                     "--max-model-size", "10KB", "--out", str(tmp_path / "a.artifact"))
    _clean(small, 2, "over the", "--max-model-size")
    # and up: a config over the default (half this machine's memory) passes a raised limit,
    # sized on the meta device, nothing allocated
    from exporter.errors import SpecError
    from exporter.model.hf_limits import check_config_size, default_limit
    config = transformers.BertConfig.from_pretrained(bert_folder)
    config.vocab_size = 2 * default_limit() // (4 * config.hidden_size)
    with pytest.raises(SpecError, match="over the .* limit"):
        check_config_size(config, transformers.AutoModel, None, "config.json")
    raised = check_config_size(config, transformers.AutoModel, 4 * default_limit(), "config.json")
    assert raised > default_limit()


# --- inconsistent sizes in an hf: config or its weights are exit 2, not internal errors -

GENERATE = ["--task", "text-generation"]


@pytest.mark.parametrize("base, change, flags, needle", [
    ("bert", {"hidden_size": 64.5}, [], "hidden_size = 64.5 (a fraction)"),
    ("bert", {"hidden_size": "32"}, [], "hidden_size = '32' (a str"),
    ("bert", {"num_attention_heads": True}, [], "num_attention_heads = true (a bool"),
    ("bert", {"hidden_act": "no-such-activation"}, [],
     "AutoModel cannot build a model from config.json"),
    ("llama", {"num_attention_heads": 0}, GENERATE, "num_attention_heads = 0 (zero)"),
    ("llama", {"num_key_value_heads": 3}, GENERATE,
     "num_attention_heads = 4 is not a multiple of num_key_value_heads = 3"),
    ("llama", {"head_dim": 0}, GENERATE, "head_dim = 0 (zero)"),
    ("llama", {"num_hidden_layers": 1.5}, GENERATE, "num_hidden_layers = 1.5"),
    ("whisper", {"encoder_attention_heads": 3}, GENERATE + ["--random-weights"],
     "d_model = 32 is not a multiple of encoder_attention_heads = 3"),
    ("llava", {"text_config": {"num_attention_heads": 0}}, ["--random-weights"],
     "text_config.num_attention_heads = 0 (zero)"),
    ("llava", {"vision_config": {"hidden_size": 48.5}}, ["--random-weights"],
     "vision_config.hidden_size = 48.5"),
], ids=["fraction-width", "string-width", "bool-heads", "unknown-activation",
        "zero-heads-generating", "kv-heads-do-not-divide", "zero-head-dim",
        "fraction-layers", "encoder-decoder-heads", "nested-text-zero-heads",
        "nested-vision-fraction"])
def test_inconsistent_hf_config_sizes_are_one_error_paragraph_exit_2(
        hf_folders, tmp_path, cli_here, base, change, flags, needle):
    folder = _changed(hf_folders[base], tmp_path, change)
    result = cli_here("build", f"hf:{folder}", "--target", "onnx", "--dry-run", *flags)
    _clean(result, 2, needle)
    assert result.stderr.count("error:") == 1, result.stderr
    assert "bug in the exporter" not in result.stderr


def test_weights_that_contradict_the_config_are_exit_2_naming_tensor_and_file(
        hf_folders, tmp_path, cli_here):
    """Weights saved for other sizes (config.json edited after saving; a tensor whose
    safetensors header gives another shape), a header that cannot be parsed, and an index
    naming a shard that is not there: each exit 2 naming what and where."""
    import struct
    edited = _changed(hf_folders["bert"], tmp_path / "edited", {"intermediate_size": 48})
    reshaped = _copy(hf_folders["bert"], tmp_path, "reshaped")
    blob = (reshaped / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + size])
    header["encoder.layer.0.intermediate.dense.weight"]["shape"] = [32, 64]  # same bytes
    text = json.dumps(header).encode()
    (reshaped / "model.safetensors").write_bytes(
        struct.pack("<Q", len(text)) + text + blob[8 + size:])
    garbled = _copy(hf_folders["bert"], tmp_path, "garbled")
    with open(garbled / "model.safetensors", "r+b") as weights:
        weights.write(struct.pack("<Q", 2**40))
    sharded = _copy(hf_folders["bert"], tmp_path, "sharded")
    names = list(header)
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    shards = {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": shards}))
    for folder, flags, needles in (
            (edited, [], ["intermediate.dense.weight is [64, 32] in model.safetensors",
                          "[48, 32]"]),
            (reshaped, ["--dry-run"], ["intermediate.dense.weight is [32, 64] in "
                                       "model.safetensors", "[64, 32]"]),
            (garbled, ["--dry-run"], ["damaged or incomplete", "model.safetensors"]),
            (sharded, ["--dry-run"], ["model-00002-of-00002.safetensors"])):
        result = cli_here("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8", *flags,
                          "--out", str(tmp_path / "x.artifact"))
        _clean(result, 2, *needles)
        assert result.stderr.count("error:") == 1, result.stderr
        assert not (tmp_path / "x.artifact").exists()


# --- a folder's own code that is not run is said ---------------------------------------

def test_auto_map_beside_a_stock_model_type_warns_that_the_folder_code_did_not_run(
        bert_folder, tmp_path, cli_here):
    folder = _changed(bert_folder, tmp_path, {"auto_map": {"AutoModel": "modeling.Evil"}})
    marker = tmp_path / "RAN"
    (folder / "modeling.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    result = cli_here("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8", "--dry-run",
                      "--json")
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    said = [w for w in json.loads(result.stdout)["warnings"] if "auto_map" in w]
    assert len(said) == 1 and "modeling.Evil" in said[0] and "not run" in said[0]
    assert "stock" in said[0] and "--trust-remote-code" in said[0]
    plain = cli_here("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8", "--dry-run")
    assert plain.returncode == 0, plain.stderr
    lines = [line for line in plain.stderr.splitlines() if "auto_map" in line]
    assert len(lines) == 1 and lines[0].startswith("warning:"), plain.stderr


# --- a factory cannot fake a build, and cannot corrupt --json ----------------------------

FACTORIES = '''
import sys, torch
def exits_zero():
    sys.exit(0)
def exits_text():
    sys.exit("bye")
def prints():
    print("hello from the factory")
    return torch.nn.Linear(4, 2), (torch.randn(1, 4),)
'''


@pytest.mark.parametrize("factory", ["exits_zero", "exits_text"])
def test_sys_exit_in_a_factory_is_a_build_error(tmp_path, cli_here, factory):
    (tmp_path / "f.py").write_text(FACTORIES)
    # in process: an exit the CLI let through would end the call with its code, as a process
    result = cli_here("build", f"{tmp_path / 'f.py'}:{factory}", "--target", "onnx", "--json",
                      "--out", str(tmp_path / "x.artifact"))
    _clean(result, 2, "sys.exit(")
    assert json.loads(result.stdout)["error"]["exit_code"] == 2
    assert not (tmp_path / "x.artifact").exists()


def test_user_prints_stay_off_the_json_stream(tmp_path, cli):
    (tmp_path / "f.py").write_text(FACTORIES)
    result = cli("build", f"{tmp_path / 'f.py'}:prints", "--target", "onnx", "--json",
                 "--out", str(tmp_path / "x.artifact"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    assert "hello from the factory" in result.stderr

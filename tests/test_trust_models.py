"""Trust, round two (issue 20): hostile or careless model sources. An hf: folder's own
code never runs, its weights are never unpickled or swapped for random ones, its config
cannot make the build allocate without bound, and a factory cannot fake a successful
build. Numbers in the test names are the issue's."""

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


def _copy(folder, tmp_path, name="ckpt"):
    return shutil.copytree(folder, tmp_path / name)


# --- 2: a checkpoint's own Python code never runs without --trust-remote-code --------------

@pytest.mark.parametrize("model_type", ["bert", "evilbert"],
                         ids=["known-type", "only-the-folder-code-knows-it"])
def test_2_auto_map_code_never_runs_and_never_prompts(bert_folder, tmp_path, model_type):
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
    print(result.returncode, result.stderr[-400:])
    assert not marker.exists(), "the folder's evil.py was imported"
    assert "[y/N]" not in result.stdout + result.stderr
    json.loads(result.stdout)  # stdout is the JSON object alone
    if model_type == "bert":  # transformers' own class for the type; the auto_map is ignored
        assert result.returncode == 0, result.stderr
    else:
        _clean(result, 2, "--trust-remote-code")


# --- 3: weights are safetensors from the folder, or refused ---------------------------------

def test_3_pytorch_model_bin_alone_is_refused_and_never_unpickled(bert_folder, tmp_path, cli):
    folder = _copy(bert_folder, tmp_path)
    marker = tmp_path / "UNPICKLED"

    class Payload:  # what a hostile pytorch_model.bin does when unpickled
        def __reduce__(self):
            return (open, (str(marker), "w"))
    (folder / "model.safetensors").unlink()
    import pickle
    with open(folder / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"payload": Payload()}, fh)
    result = cli("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8")
    _clean(result, 2, "model.safetensors", "safe_serialization=True")
    assert not marker.exists(), "pytorch_model.bin was unpickled"


def test_3_index_pointing_outside_the_folder_is_refused(bert_folder, tmp_path, cli):
    folder = _copy(bert_folder, tmp_path)
    (folder / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    names = list(__import__("safetensors").safe_open(
        tmp_path / "elsewhere.safetensors", "pt").keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: "../elsewhere.safetensors" for n in names}}))
    _clean(cli("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8"), 2,
           "outside its folder")


# --- 8: hostile config sizes are refused before anything is allocated -----------------------

@pytest.mark.parametrize("change, needle", [
    ({"vocab_size": 10**9}, "GiB"),
    ({"num_hidden_layers": 100_000}, "layers"),
    ({"num_attention_heads": 0}, "zero or negative"),
    ({"hidden_size": -32}, "zero or negative"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "cannot build"),
], ids=["vocab-1e9", "100k-layers", "0-heads", "negative-size", "heads-do-not-divide"])
def test_8_hostile_config_sizes_are_exit_2_quickly(bert_folder, tmp_path, cli, change, needle):
    import time
    folder = _copy(bert_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    result = cli("build", f"hf:{folder}", "--target", "onnx", "--seq-len", "8",
                 "--random-weights")
    print(change, f"{time.perf_counter() - start:.1f}s", result.stderr[-300:])
    _clean(result, 2, needle)


def test_8_the_size_limit_is_overridable_both_ways(bert_folder, tmp_path, cli):
    small = cli("build", f"hf:{bert_folder}", "--target", "onnx", "--seq-len", "8",
                "--max-model-size", "10KB", "--out", str(tmp_path / "a.artifact"))
    _clean(small, 2, "over the", "--max-model-size")


# --- 9: a factory cannot fake a build, and cannot corrupt --json ----------------------------

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
def test_9_sys_exit_in_a_factory_is_a_build_error(tmp_path, cli, factory):
    (tmp_path / "f.py").write_text(FACTORIES)
    result = cli("build", f"{tmp_path / 'f.py'}:{factory}", "--target", "onnx", "--json",
                 "--out", str(tmp_path / "x.artifact"))
    _clean(result, 2, "sys.exit(")
    assert json.loads(result.stdout)["error"]["exit_code"] == 2
    assert not (tmp_path / "x.artifact").exists()


def test_9_user_prints_stay_off_the_json_stream(tmp_path, cli):
    (tmp_path / "f.py").write_text(FACTORIES)
    result = cli("build", f"{tmp_path / 'f.py'}:prints", "--target", "onnx", "--json",
                 "--out", str(tmp_path / "x.artifact"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    assert "hello from the factory" in result.stderr

"""The same hostile artifacts (tests/native/cases.py) refused by both loaders, the Python
runtime and the native edge-run, with exit 2 and the same reason; the good artifact they
are made from runs in both and gives the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.native.cases import CASES, Keys, signed
from tests.native.conftest import native_refusal, python_refusal, run_native


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> Keys:
    from runtime.format.signing import generate_keys
    base = tmp_path_factory.mktemp("native-keys")
    key, pub = generate_keys(base / "signer")
    _, other = generate_keys(base / "other")
    return Keys(signer_key=key, signer_pub=pub, other_pub=other)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_loaders_refuse_the_hostile_artifact_for_the_same_reason(
        case, native_mlp, edge_run, mlp_inputs, keys, tmp_path):
    bad, key = case.make(native_mlp, tmp_path / "bad.artifact", keys)
    python = python_refusal(bad, key)
    native = native_refusal(edge_run, bad, mlp_inputs, tmp_path / "out.npz", key)
    assert (python.exit_code, native.exit_code) == (2, 2), (python, native)
    assert case.keyword in python.message, python.message
    assert case.keyword in native.message, native.message
    assert str(bad) in native.message and "Try:" in native.message, native.message


def test_the_good_artifact_gives_the_python_runtimes_outputs_bit_for_bit(
        native_mlp, edge_run, mlp_inputs, tmp_path):
    import runtime
    out = tmp_path / "out.npz"
    done = run_native(edge_run, native_mlp, mlp_inputs, out)
    assert done.returncode == 0, done.stdout + done.stderr
    program = runtime.load(native_mlp)
    with np.load(mlp_inputs) as given, np.load(out) as got:
        expected = program.run({"x": __import__("torch").from_numpy(given["x"])})
        assert list(got) == program.output_names
        for name in got:
            assert np.array_equal(got[name], expected[name].numpy()), name


def test_a_signed_artifact_loads_in_both_with_the_signers_key(
        native_mlp, edge_run, mlp_inputs, keys, tmp_path):
    import runtime
    import shutil
    path = signed(shutil.copy(native_mlp, tmp_path / "signed.artifact"), keys.signer_key)
    runtime.load(path, trusted_keys=[keys.signer_pub])
    done = run_native(edge_run, path, mlp_inputs, tmp_path / "out.npz", keys.signer_pub)
    assert done.returncode == 0, done.stdout

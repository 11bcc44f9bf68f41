"""bench/decode_chain_cuda.py's variant table: a variant that gives some of the launch
options gets the defaults for the rest (a 3-option variant once ran with mlp=False)."""

from bench.decode_chain_cuda import _launch_options


def test_a_variant_gets_the_defaults_for_the_options_it_does_not_give():
    assert _launch_options([]) == (None, False, None, None, None)
    assert _launch_options([False]) == (False, False, None, None, None)
    assert _launch_options([None, True, 128]) == (None, True, 128, None, None)
    hook = object()
    assert _launch_options([None, True, None, hook]) == (None, True, None, hook, None)

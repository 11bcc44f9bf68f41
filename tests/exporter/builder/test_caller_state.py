"""An in-process build leaves its caller's process as it was: torch's random state,
torchao's logger levels, Inductor's ``aot_inductor.metadata`` setting and the options
torchao's weight-only quantizing sets, a root logger without handlers."""

from __future__ import annotations

import logging

import torch

from exporter.builder.caller_state import random_state_left_alone


def test_random_state_is_the_callers_after():
    before = torch.get_rng_state()
    with random_state_left_alone():
        torch.randn(3)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_quantized_cpu_build_leaves_the_process_settings(tmp_path):
    """int8-dynamic on cpu: PT2E (torchao's convert_pt2e draws random examples the
    first time it runs in a process), then AOTInductor (which writes the package's device
    and ISA into its metadata setting in place)."""
    import exporter
    from torch._inductor import config

    loggers = [logging.getLogger(name) for name in ("torchao", "torchao.kernel.intmm")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)  # the caller's own choice
    try:
        metadata = dict(config.aot_inductor.metadata)
        state = torch.get_rng_state()
        built = exporter.build("zoo:mlp", target="cpu", quantize="int8-dynamic",
                               out=tmp_path / "mlp.artifact")
        assert built.manifest.validation["passed"]
        assert torch.equal(torch.get_rng_state(), state)
        assert [logger.level for logger in loggers] == [logging.WARNING] * 2
        assert config.aot_inductor.metadata == metadata
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def test_an_onnx_quantized_build_leaves_the_root_logger_without_handlers(tmp_path):
    """ONNX Runtime's quantizer logs through ``logging.warning``, which configures a root
    logger that has no handlers (basicConfig); the caller's own basicConfig must still
    work after a build."""
    import exporter

    root = logging.getLogger()
    given = root.handlers[:]
    root.handlers.clear()  # as in a script that has not configured logging (pytest has)
    try:
        built = exporter.build("zoo:mlp", target="onnx", quantize="int8-dynamic",
                               out=tmp_path / "mlp.artifact")
        assert built.manifest.validation["passed"]
        assert root.handlers == []
    finally:
        root.handlers[:] = given


def test_a_root_logger_without_handlers_has_none_after():
    """ExecuTorch's XNNPACK partitioner calls basicConfig when first imported."""
    from exporter.builder.caller_state import root_logger_left_alone

    root = logging.getLogger()
    given, level = root.handlers[:], root.level
    root.handlers.clear()
    try:
        root.setLevel(logging.INFO)
        with root_logger_left_alone():
            logging.basicConfig(level=logging.WARNING)
            assert root.handlers
        assert root.handlers == [] and root.level == logging.INFO
    finally:
        root.handlers[:] = given
        root.setLevel(level)


def _torchao_settings() -> dict:
    from torch._inductor import config

    from exporter.builder.caller_state import TORCHAO_INDUCTOR_SETTINGS
    return {name: config.get_config_copy()[name] for name in TORCHAO_INDUCTOR_SETTINGS}


def _callers_own_settings():
    """The caller's choice, every one the opposite of torchao's (a test before this one
    in the process may have run torchao's quantizing outside a build)."""
    from torch._inductor import config

    from exporter.builder.caller_state import TORCHAO_INDUCTOR_SETTINGS
    return config.patch({name: False for name in TORCHAO_INDUCTOR_SETTINGS})


def test_torchaos_inductor_settings_are_put_back_after_a_build():
    from torchao.quantization.utils import recommended_inductor_config_setter

    from exporter.builder.caller_state import left_alone
    with _callers_own_settings():
        given = _torchao_settings()
        with left_alone(quantizes=True):
            recommended_inductor_config_setter()
            assert _torchao_settings() != given  # what torchao's quantize_ does
        assert _torchao_settings() == given


def test_a_weight_only_quantized_build_leaves_inductors_settings(tmp_path):
    """int8-weight: torchao's Int8WeightOnlyConfig turns coordinate-descent tuning (and
    more) on in Inductor's config for the rest of the process when it quantizes."""
    import exporter
    with _callers_own_settings():
        given = _torchao_settings()
        built = exporter.build("zoo:mlp", target="cpu", quantize="int8-weight",
                               out=tmp_path / "mlp.artifact")
        assert built.manifest.validation["passed"]
        assert _torchao_settings() == given

"""The order test files go out to pytest-xdist's workers (``make test``: ``--dist loadfile
--no-loadscope-reorder``): the files that take longest first, so that no long file starts
last and leaves one worker running alone while the other waits. pytest-xdist's own order
(the files with the most tests first) started the few-but-long files late.

HEAVIEST is measured (CPU seconds of each file, the builds it waits for included; see
docs/testing.md), slowest first. Two files that wait for the same shared build (a
``built_once`` fixture or the native runner's build lock) are not next to each other: the
second worker would wait on the lock instead of working. A file not listed keeps its
place after them, in collection order.
"""

from __future__ import annotations

HEAVIEST = (
    "tests/native/test_executorch_native.py",  # the executorch runner: the longest test
    "tests/targets/onnx/test_onnx_target.py",  # custom_onnx
    "tests/native/test_conformance.py",  # builds edge_run and native_mlp for the native files
    "tests/targets/executorch/test_executorch_target.py",
    "tests/exporter/lm/test_seq2seq.py",  # builds bart_onnx and whisper_onnx
    "tests/system/test_reliability.py",
    "tests/passes/test_quantize.py",
    "tests/targets/test_target_builds.py",  # one build per target
    "tests/runtime/test_generate_runtime.py",  # builds onnx_lm
    "tests/native/test_tvm_native.py",  # the aarch64 tvm runner
    "tests/targets/tvm/test_tvm_target.py",
    "tests/exporter/ship/test_package.py",
    "tests/trust/test_trust_artifacts.py",
    "tests/trust/test_trust_models.py",
    "tests/trust/test_trust_generation.py",
    "tests/trust/test_trust_files.py",
    "tests/exporter/lm/test_llm_bench.py",
    "tests/exporter/matrix/test_matrix.py",
    "tests/exporter/model/test_whisper.py",
    "tests/targets/executorch/test_executorch_quantize.py",
    "tests/native/test_executorch_aarch64.py",  # the aarch64 executorch runner
    "tests/targets/onnx/test_generation_onnx.py",
    "tests/exporter/model/test_hf_spec.py",
    "tests/exporter/cli/test_cli_style.py",
    # files of 23-30 s: started late, one ran alone at the end of the run
    "tests/targets/onnx/test_own_kernels_build.py",
    "tests/targets/tvm/test_tvm_compile_failures.py",
    "tests/runtime/test_aoti_constants.py",
    "tests/targets/executorch/test_executorch_xnnpack_guards.py",
    "tests/exporter/lm/test_generating_limits.py",
    "tests/exporter/lm/test_cache_contract.py",
    "tests/targets/onnx/test_onnx_packed_attention.py",
    "tests/exporter/cli/test_bad_inputs.py",
    "tests/exporter/report/test_html_report.py",
    "tests/targets/aoti/test_build_cpu.py",
    "tests/native/test_edge_run.py",
    "tests/exporter/lm/test_generation.py",
    "tests/targets/executorch/test_executorch_bisect.py",
    "tests/exporter/lm/test_generation_gate.py",
    "tests/system/test_layering.py",
    "tests/trust/test_trust_bundle.py",
    "tests/exporter/cli/test_cli_conventions.py",
    "tests/targets/executorch/test_executorch_int8_recipes.py",
    "tests/exporter/model/test_external_model.py",
    "tests/exporter/validation/test_bisect.py",
    "tests/trust/test_trust_report.py",
    # files of 10-35 s that went out last in collection order (the lead's run at 28e738b:
    # test_trust_matrix, 23 s, ran alone at the end while the other worker idled 22 s)
    "tests/exporter/matrix/test_matrix_warm.py",
    "tests/trust/test_trust_matrix.py",
    "tests/exporter/report/test_progress.py",
    "tests/exporter/builder/test_lowering_fallback.py",
    "tests/runtime/test_fuzz_loader.py",
    "tests/exporter/validation/test_validation_process.py",
    "tests/targets/onnx/test_onnx_backend.py",
    "tests/targets/aoti/test_decode_kernels.py",
    "tests/targets/aoti/test_int4_rows.py",  # 26 s here: three decode steps captured
    "tests/targets/onnx/test_onnx_quantize_memory.py",
    "tests/exporter/cli/test_config_file.py",
    "tests/system/test_real_world.py",
    "tests/plan/test_memory_plan.py",
    "tests/exporter/cli/test_startup.py",
    "tests/targets/aoti/test_cpu_backend_choice.py",
    "tests/targets/test_target_contract.py",
    "tests/targets/aoti/test_reproducible.py",
)


def heaviest_first(items: list) -> None:
    """Sort pytest's collected items in place: HEAVIEST's files first, in that order; every
    file's own tests stay together and in their order (the sort is stable)."""
    rank = {path: place for place, path in enumerate(HEAVIEST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))

"""The quantized gate's record is JSON whatever the outputs are."""

import json

import torch

from exporter.validation.gates import SQNR_LIMIT_DB, compare_quantized


def test_an_all_zero_output_equal_to_eager_gives_a_json_record_that_passes():
    zeros = torch.zeros(2, 8)
    row = compare_quantized(zeros, zeros.clone(), min_sqnr_db=20.0, min_cosine=0.99)
    assert row["passed"] and row["sqnr_db"] == SQNR_LIMIT_DB
    json.dumps(row, allow_nan=False)


def test_a_nonzero_output_where_eager_is_zero_fails_with_a_json_record():
    row = compare_quantized(torch.ones(2, 8), torch.zeros(2, 8), min_sqnr_db=20.0,
                            min_cosine=0.99)
    assert not row["passed"] and row["sqnr_db"] == -SQNR_LIMIT_DB
    json.dumps(row, allow_nan=False)

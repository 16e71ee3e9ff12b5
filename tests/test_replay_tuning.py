"""benchmarks/replay_tuning.py: the oracle budget, the calibration table's data, variant parsing."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.replay_tuning import calibration, calibration_table, oracle, parse_variant
from lookahead.cost import CostModel

# the prompt teaches 2 -> 5 -> 6 -> 9; the output is 5 6 7: the proposal after "2" holds 5, 6 (accepted) and 9
RECORD = {"workload": "x", "prompt": [2, 5, 6, 9, 1, 2], "output": [5, 6, 7], "max_new_tokens": 3}


def test_oracle_verifies_exactly_what_will_be_accepted_when_it_pays():
    cheap = CostModel(((1, 1.0), (4, 2.0)))  # 3 tokens for t(3) = 1.67 beat 1 for t(1) = 1
    res = oracle(RECORD, cheap)
    assert res["tokens_per_call"] == 3.0  # one call: 5, 6 accepted, 7 emitted from the last accepted row
    prohibitive = CostModel(((1, 1.0), (2, 1000.0)))
    res = oracle(RECORD, prohibitive)
    # never drafts: plain decoding, three calls; the two after the prefill are priced t(1) each on the given curve
    assert res["tokens_per_call"] == 1.0 and res["calls"] == 3
    assert res["modelled_cost"] == 2 * float(prohibitive(1))


def test_calibration_judges_every_proposed_node_by_the_recorded_text():
    cost = CostModel(((1, 1.0), (4, 2.0)))
    cal = calibration({"prompts": {"a": RECORD}}, cost)
    n = len(cal["predicted"])
    assert n == len(cal["accepted"]) == len(cal["origin"]) and n >= 3
    assert np.all((cal["predicted"] >= 0) & (cal["predicted"] <= 1))
    assert int(cal["accepted"].sum()) >= 2  # 5 and 6 of the first proposal
    never = dict(RECORD, output=[70, 71, 72])  # tokens the prompt never had: nothing proposed is right
    cal = calibration({"prompts": {"a": never}}, cost)
    assert len(cal["accepted"]) and not cal["accepted"].any()
    table = calibration_table(cal)
    assert table.splitlines()[0].startswith("| estimated | nodes |") and "| 0.000 |" in table


def test_parse_variant_names_budget_fields_and_refuses_others():
    assert parse_variant("margin=1.0,depth_cells=16") == ("margin=1.0,depth_cells=16",
                                                          {"margin": 1.0, "depth_cells": 16})
    text = "match_scale=[0.5,1,1.3],margin=1.0"  # a list keeps its commas, and becomes a tuple as the field's type
    assert parse_variant(text) == (text, {"match_scale": (0.5, 1, 1.3), "margin": 1.0})
    with pytest.raises(ValueError, match="not a Tuning field"):
        parse_variant("margins=1.0")

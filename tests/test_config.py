"""Validation of the public ``LookaheadConfig`` and of the private ``Tuning``: every bad value raises ValueError
naming the field and the value; unknown decoder settings raise TypeError listing the settings."""

from __future__ import annotations

import dataclasses

import pytest

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead._tuning import DEFAULT, Tuning
from lookahead.config import FLAT_CURVE

# -- LookaheadConfig ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_draft_tokens", -1),
        ("max_draft_tokens", 1025),
        ("max_draft_tokens", 10**6),
        ("max_draft_tokens", 2.5),
        ("max_draft_tokens", True),
        ("max_draft_tokens", "wide"),
        ("max_draft_tokens", None),
        ("window", -1),
        ("window", 129),
        ("window", 10**6),  # failed on the first step once: "MemoryError: Unable to allocate 931. GiB"
        ("window", 1.5),
        ("window", False),
        ("window", "on"),
        ("cost_curve", "steep"),
        ("cost_curve", 5),
        ("cost_curve", ()),
        ("cost_curve", ((0, 1.0),)),
        ("cost_curve", ((1, 0.0),)),
        ("cost_curve", ((1, -1.0), (2, 1.0))),
        ("cost_curve", ((1,),)),
        ("cost_curve", (("one", 1.0),)),
    ],
)
def test_bad_config_values_name_field_and_value(field, value):
    with pytest.raises(ValueError) as err:
        LookaheadConfig(**{field: value})
    assert str(err.value).startswith(f"LookaheadConfig.{field}={value!r} is invalid: "), str(err.value)


def test_largest_and_smallest_allowed_values_are_accepted():
    LookaheadConfig(max_draft_tokens=1024, window=128)
    LookaheadConfig(max_draft_tokens=0, window=0)
    LookaheadConfig(max_draft_tokens="auto", window="auto", cost_curve=None)


def test_a_cost_curve_is_kept_as_int_float_points_and_flat_is_the_flat_curve():
    assert LookaheadConfig(cost_curve=[[1, 1], [4, "2.5"]]).cost_curve == ((1, 1.0), (4, 2.5))
    assert LookaheadConfig(cost_curve="flat").cost_curve == FLAT_CURVE == ((1, 0.010), (2, 0.010), (256, 0.0102))
    assert LookaheadConfig().cost_curve is None


def test_config_is_frozen():
    cfg = LookaheadConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.window = 3
    assert [f.name for f in dataclasses.fields(LookaheadConfig)] == ["max_draft_tokens", "window", "cost_curve"]


def test_step_nodes_and_window_columns_read_the_tuning_under_auto():
    assert LookaheadConfig().step_nodes(DEFAULT) == (63, 255)
    assert LookaheadConfig().step_nodes(Tuning(step_nodes_auto=(31, 127))) == (31, 127)
    assert LookaheadConfig(max_draft_tokens=9).step_nodes(DEFAULT) == (9, 9)
    assert LookaheadConfig(max_draft_tokens=0).step_nodes(DEFAULT) == (0, 0)
    assert LookaheadConfig().window_columns(DEFAULT) == 8
    assert LookaheadConfig().window_columns(Tuning(window_auto_width=4)) == 4
    assert LookaheadConfig(window=3).window_columns(DEFAULT) == 3
    assert LookaheadConfig(window=0).window_columns(DEFAULT) == 0


# -- the decoder's settings -----------------------------------------------------------------------------------


def test_decoder_accepts_config_fields_as_settings_and_over_a_config():
    dec = LookaheadDecoder(max_draft_tokens=4)
    assert dec.config == LookaheadConfig(max_draft_tokens=4) and dec.tuning is DEFAULT
    dec = LookaheadDecoder(LookaheadConfig(window=3), max_draft_tokens=5)
    assert (dec.config.window, dec.config.max_draft_tokens) == (3, 5)
    dec = LookaheadDecoder(cost_curve="flat")
    assert dec.config.cost_curve == FLAT_CURVE
    tuning = Tuning(tree_nodes=8)
    assert LookaheadDecoder(_tuning=tuning).tuning is tuning


@pytest.mark.parametrize("settings", [dict(tree_nodes=4), dict(step_nodes=9), dict(window_width=2),
                                      dict(trie=None), dict(adaptive=False, max_draft_tokens=3)])
def test_unknown_decoder_settings_raise_type_error_listing_the_settings(settings):
    with pytest.raises(TypeError) as err:
        LookaheadDecoder(**settings)
    message = str(err.value)
    unknown = sorted(k for k in settings if k != "max_draft_tokens")
    assert f"unknown setting(s) {unknown}" in message
    for name in ("max_draft_tokens", "window", "cost_curve", "store", "corpus", "heads", "draft", "tokenizer",
                 "config"):
        assert repr(name) in message, name


def test_decoder_arguments_of_the_wrong_kind_are_refused():
    with pytest.raises(TypeError):
        LookaheadDecoder(config={"max_draft_tokens": 3})
    with pytest.raises(TypeError, match="_tuning must be a lookahead._tuning.Tuning"):
        LookaheadDecoder(_tuning={"tree_nodes": 3})
    with pytest.raises(ValueError, match=r"LookaheadConfig.window=200 is invalid"):
        LookaheadDecoder(window=200)
    with pytest.raises(ValueError, match=r"LookaheadConfig.max_draft_tokens=-2 is invalid"):
        LookaheadDecoder(LookaheadConfig(), max_draft_tokens=-2)


# -- Tuning ---------------------------------------------------------------------------------------------------

_NO_CELLS = ("Tuning accepts depth_cells=0 / rank_cells=0 (a non-negative int); AcceptanceStats then makes count "
             "arrays with no depth (rank) cell, which budget.record and node_probabilities index at -1 and past the "
             "end: "
             "on a tiny llama depth_cells=0 gave another greedy output than plain generate in one run and aborted the "
             "next, rank_cells=0 aborted ('double free or corruption'); both must be >= 1")
_PRIOR_TYPES = ("Tuning(priors=((1.0, 0.5), 'ab')) raises TypeError from the check's own min(p) <= 0 on a str, not "
                "ValueError naming Tuning.priors")


@pytest.mark.parametrize(
    "field, value",
    [
        ("ngram_size", 1),
        ("ngram_size", "8"),
        ("max_match", 0),
        ("max_match", 12),  # not below ngram_size (12)
        ("tree_nodes", -1),
        ("tree_depth", -2),
        ("trie_capacity", 10),  # below 4 * ngram_size**2
        ("tree_nodes", 2.5),
        ("tree_depth", True),
        ("copy_nodes", -1),
        ("recycle_keep", 1),  # a bool field takes a bool only
        ("grouped_prefill", "padded"),
        ("adaptive", None),
        ("margin", -0.5),  # a float field: a non-negative number
        ("margin", True),
        ("max_seconds", "10"),
        ("buckets", [1, 8, 16]),  # a tuple field takes a tuple
        ("window_ngram", 1),
        ("decay", 1.5),
        ("belief_relax", 1.01),
        ("window_gain_keep", 2.0),
        ("learn_slope_cpu", 1.5),
        ("belief_prior", 0.0),
        ("belief_off_scale", 0.0),
        ("depth_lift", 0.0),
        ("depth_lift", 1.5),
        ("learn_slope_gpu", 0.0),
        ("linear_layout", "fast"),
        ("priors", ()),
        ("priors", ((1.0, 0.0),)),
        ("priors", ((1.0,),)),
        ("priors", ((1.0, 0.5), "ab")),
        ("depth_cells", 0),
        ("rank_cells", 0),
        ("step_nodes_auto", (63,)),
    ],
)
def test_bad_tuning_values_name_field_and_value(field, value):
    with pytest.raises(ValueError) as err:
        Tuning(**{field: value})
    assert str(err.value).startswith(f"Tuning.{field}={value!r} is invalid: "), str(err.value)


def test_an_ngram_size_the_trie_cannot_hold_is_refused_naming_both_fields():
    """An absurd n-gram size is refused by its bound; one the trie's capacity cannot hold names the capacity and the
    n-gram size."""
    with pytest.raises(ValueError, match=r"^Tuning\.ngram_size=1000000 is invalid: "):
        Tuning(ngram_size=10**6)
    with pytest.raises(ValueError) as err:
        Tuning(ngram_size=64, max_match=63, trie_capacity=1000)
    assert str(err.value).startswith("Tuning.trie_capacity=1000 is invalid: ") and "ngram_size" in str(err.value)
    Tuning(ngram_size=64, max_match=63, trie_capacity=4 * 64 * 64)  # the smallest capacity for it


def test_tuning_is_frozen_and_its_default_is_the_plain_instance():
    assert DEFAULT == Tuning()
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.tree_nodes = 3
    assert dataclasses.replace(DEFAULT, tree_nodes=3).tree_nodes == 3 and DEFAULT.tree_nodes == 16

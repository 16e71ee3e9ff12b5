"""LookaheadConfig validation: every bad value raises ValueError naming the field and the value."""

from __future__ import annotations

import dataclasses

import pytest

from lookahead import LookaheadConfig, LookaheadDecoder


@pytest.mark.parametrize(
    "field, value",
    [
        ("ngram_size", 1),
        ("ngram_size", "8"),
        ("max_match", 0),
        ("max_match", 12),
        ("tree_nodes", -1),
        ("tree_depth", -2),
        ("trie_capacity", 10),
        ("tree_nodes", 2.5),
        ("tree_depth", True),
    ],
)
def test_bad_values_name_field_and_value(field, value):
    with pytest.raises(ValueError) as err:
        LookaheadConfig(**{field: value})
    assert field in str(err.value) and repr(value) in str(err.value)


def test_config_is_frozen():
    cfg = LookaheadConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tree_nodes = 3


def test_decoder_accepts_overrides():
    dec = LookaheadDecoder(tree_nodes=4)
    assert dec.config.tree_nodes == 4
    dec = LookaheadDecoder(LookaheadConfig(tree_depth=3), tree_nodes=5)
    assert (dec.config.tree_depth, dec.config.tree_nodes) == (3, 5)
    with pytest.raises(TypeError):
        LookaheadDecoder(config={"tree_nodes": 3})


@pytest.mark.parametrize(
    "field, value",
    [
        ("ngram_size", 10**6),  # refused for itself, not with a message about trie_capacity
        ("ngram_size", 65),
        ("tree_nodes", 257),
        ("tree_depth", 65),
        ("window_width", 10**6),  # failed on the first step: "MemoryError: Unable to allocate 931. GiB"
        ("window_width", 513),
        ("window_ngram", 65),
        ("window_candidates", 10**6),
        ("trie_capacity", 1 << 27 | 1),
        ("trie_capacity", 2**31),
    ],
)
def test_absurd_values_are_refused_up_front_naming_field_and_value(field, value):
    with pytest.raises(ValueError) as err:
        LookaheadConfig(**{field: value})
    message = str(err.value)
    assert message.startswith(f"LookaheadConfig.{field}={value!r} is invalid: must be in [") or (
        field == "ngram_size" and message == f"LookaheadConfig.ngram_size={value!r} is invalid: must be <= 64"
    ), message


def test_largest_allowed_values_are_accepted():
    LookaheadConfig(ngram_size=64, max_match=63, tree_nodes=256, tree_depth=64, trie_capacity=1 << 27)
    LookaheadConfig(window_width=512, window_ngram=2, window_candidates=0)
    LookaheadConfig(window_width=100, window_ngram=4, window_candidates=4)  # 312 window rows per step
    LookaheadConfig(window_width=0, window_ngram=64, window_candidates=512)  # window off: rows not counted


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(window_width=200, window_ngram=4, window_candidates=4), "window_width"),  # 204 * 3 = 612 rows
        (dict(window_width=8, window_ngram=9, window_candidates=60), "window_candidates"),  # 68 * 8 = 544
    ],
)
def test_window_rows_per_step_are_bounded_naming_the_larger_part(settings, field):
    with pytest.raises(ValueError) as err:
        LookaheadConfig(**settings)
    message = str(err.value)
    assert message.startswith(f"LookaheadConfig.{field}={settings[field]!r} is invalid: the window would")
    assert "more than 512" in message

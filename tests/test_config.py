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

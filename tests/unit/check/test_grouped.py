"""Many modules of one cause listed in a line: numbered layers folded into one pattern each."""

from __future__ import annotations

from hooktrace.check.grouped import patterns


def test_numbered_layers_fold_into_a_pattern_in_the_order_first_met() -> None:
    names = ["embed", *(f"layers.{i}.k_proj" for i in range(32)), "norm", "",
             "blocks.3.0.attn", "blocks.12.1.attn"]
    assert patterns(names) == "embed, layers.*.k_proj (x32), norm, (root), blocks.*.*.attn (x2)"


def test_a_name_with_digits_inside_a_part_is_not_a_number() -> None:
    assert patterns(["conv1", "layer1.0.conv2", "layer1.1.conv2", "layer2.0.conv2", "0"]) == \
        "conv1, layer1.*.conv2 (x2), layer2.0.conv2, 0"


def test_past_the_patterns_kept_how_many_more() -> None:
    assert patterns([f"m{i}" for i in range(5)], keep=3) == "m0, m1, m2 and 2 more"

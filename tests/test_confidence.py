"""One meaning of confidence: TypeSafe's reference formulas, on the examples its
documentation and its users give, and within [0, 1] on any distribution."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decider.questions.confidence import concentration, peak


def test_a_choices_confidence_is_its_top_probability_from_uniform_to_certain():
    assert peak([0.90, 0.06, 0.04]) == pytest.approx(0.85)  # TypeSafe's documented example
    assert peak([0.892, 0.014, 0.094]) == pytest.approx(0.838)  # what clients expect
    assert peak([1 / 3] * 3) == pytest.approx(0.0) and peak([0.0, 1.0]) == 1.0
    assert peak([1.0]) == 1.0


def test_a_scales_confidence_is_how_close_the_probability_sits_to_its_mode():
    assert concentration([0.0, 1.0, 0.0]) == 1.0
    assert concentration([1 / 3] * 3) == 0.0
    # mode 1 of 3: spread 0.1 + 0.1 against a uniform spread of 2/3
    assert concentration([0.1, 0.8, 0.1]) == pytest.approx(1 - 0.2 / (2 / 3))
    # far from the mode costs more than near it
    assert concentration([0.7, 0.2, 0.1]) > concentration([0.7, 0.1, 0.2])
    assert concentration([1.0]) == 1.0


@given(st.lists(st.floats(0, 1), min_size=2, max_size=12).filter(lambda ps: sum(ps) > 1e-6))
def test_both_lie_in_zero_to_one(ps):
    assert 0.0 <= peak(ps) <= 1.0 and 0.0 <= concentration(ps) <= 1.0

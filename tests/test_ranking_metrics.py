"""SToICaL ranking metrics by hand: CVR, nDCG with log gold gains, set-overlap R@k."""
import math

import numpy as np
import pytest

from gr_jax.ranking.metrics import constraint_violation_rate, length_normalised, ndcg, set_overlap_recall

# Query 0: 3 gold (ranked perfectly, negative last); query 1: 2 gold, swapped, the negative above gold rank 2.
SCORES = np.array([[-1.0, -2.0, -3.0, -9.0], [-2.0, -1.0, -5.0, -1.5]])
VALID = np.array([[True, True, True], [True, True, False]])


def test_cvr():
    assert constraint_violation_rate(SCORES, VALID) == 0.5  # query 1's gold rank 1 (-2.0) is below -1.5


def test_ndcg_by_hand():
    discounts = [1 / math.log2(i + 2) for i in range(4)]
    # Query 1: gains log 3, log 2 for gold ranks 1, 2; predicted order: gold 2 (-1.0), negative (-1.5), gold 1.
    dcg = math.log(2) * discounts[0] + 0 * discounts[1] + math.log(3) * discounts[2]
    ideal = math.log(3) * discounts[0] + math.log(2) * discounts[1]
    assert ndcg(SCORES, VALID) == pytest.approx((1.0 + dcg / ideal) / 2)


def test_set_overlap_recall_by_hand():
    assert set_overlap_recall(SCORES, VALID, k=1) == (pytest.approx(0.5), 2)  # query 1's top-1 is gold rank 2
    assert set_overlap_recall(SCORES, VALID, k=2) == (pytest.approx((1.0 + 0.5) / 2), 2)
    assert set_overlap_recall(SCORES, VALID, k=3) == (pytest.approx(1.0), 1)  # only query 0 has 3 gold


def test_length_normalised_and_bad_input():
    np.testing.assert_allclose(length_normalised(np.array([-6.0, -3.0]), np.array([3, 1])), [-2.0, -3.0])
    with pytest.raises(ValueError, match="first columns"):
        ndcg(SCORES, np.array([[True, False, True], [True, True, False]]))
    with pytest.raises(ValueError, match="must be"):
        ndcg(SCORES, VALID[:, :2])

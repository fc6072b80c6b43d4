"""The order the cluster tier's tests are handed out in (helpers.deal_out, tests/conftest.py)."""

from helpers import deal_out


def test_tests_that_run_one_at_a_time_are_spread_evenly_among_the_others_in_their_order():
    items = [f"t{n}" for n in range(9)] + ["s0", "s1", "s2"]
    dealt = deal_out(items, lambda item: item.startswith("s"))
    assert dealt == ["t0", "s0", "t1", "t2", "t3", "s1", "t4", "t5", "t6", "s2", "t7", "t8"]   # 3 apart


def test_without_tests_of_one_kind_the_order_is_kept():
    items = ["a", "b", "c"]
    assert deal_out(items, lambda item: False) == items
    assert deal_out(items, lambda item: True) == items

"""Eviction policies: exact behaviour on hand-built sequences, and invariants (hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.policies import ARC, FIFO, LFU, LRU, POLICIES, S3FIFO, make_policy


def test_lru_evicts_least_recently_used():
    p = LRU(3)
    assert p.insert_many([1, 2, 3]) == []
    p.touch_many([1])
    assert p.insert_many([4]) == [2]
    assert p.insert_many([5]) == [3]
    assert p.keys_in_order() == [1, 4, 5]


def test_lru_reinsert_of_resident_key_is_sequential():
    p = LRU(2)
    p.insert_many([1, 2])
    # 3 evicts 1 first, then 1 comes back and evicts 2: exactly one-key-at-a-time semantics
    assert p.insert_many([3, 1]) == [1, 2]
    assert p.keys_in_order() == [3, 1]


def test_fifo_ignores_hits():
    p = FIFO(3)
    p.insert_many([1, 2, 3])
    p.touch_many([1])
    assert p.insert_many([4]) == [1]
    assert p.insert_many([2, 5]) == [2]  # 2 is resident (no-op), 5 evicts the oldest: 2
    assert p.keys_in_order() == [3, 4, 5]


def test_lfu_evicts_least_frequent_then_least_recent():
    p = LFU(3)
    p.insert_many([1, 2, 3])
    p.touch_many([1, 2])
    assert p.insert_many([4]) == [3]
    assert p.insert_many([5]) == [4]
    p.touch_many([5])
    # 1, 2, 5 all have frequency 2; 1 reached it first
    assert p.insert_many([6]) == [1]
    assert sorted(p.keys_in_order()) == [2, 5, 6]


def test_s3fifo_promotes_reused_keys_and_readmits_ghosts():
    p = S3FIFO(10)
    p.insert_many(list(range(1, 11)))
    p.touch_many([1])
    assert p.insert_many([11]) == [2]  # 1 was hit: moves to main; 2 is evicted into the ghost
    assert p.insert_many([2]) == [3]  # ghost hit: 2 goes straight to main
    p.touch_many([4])
    assert p.insert_many([12]) == [5]


def test_s3fifo_is_scan_resistant_where_lru_is_not():
    s3, lru = S3FIFO(10), LRU(10)
    for p in (s3, lru):
        p.insert_many(list(range(10)))
        p.touch_many([0, 1, 2])
        p.insert_many(list(range(100, 120)))
        for k in range(100, 130):  # a one-hit scan
            p.insert_many([k])
    assert {0, 1, 2} <= set(s3.keys_in_order())
    assert not {0, 1, 2} & set(lru.keys_in_order())


def test_arc_adapts_on_ghost_hits():
    p = ARC(2)
    p.insert_many([1, 2])
    p.touch_many([1])  # T2 = [1], T1 = [2]
    assert p.insert_many([3]) == [2]  # p = 0: T1 gives up 2 (to ghost B1)
    assert p.insert_many([2]) == [1]  # B1 hit: p -> 1, T2's LRU (1) goes to ghost B2
    assert p.insert_many([1]) == [3]  # B2 hit: p -> 0, T1's 3 is evicted
    assert sorted(p.keys_in_order()) == [1, 2]


def test_shrink_to_for_watermarks():
    for name in POLICIES:
        p = make_policy(name, 10)
        p.insert_many(list(range(10)))
        evicted = p.shrink_to(6)
        assert len(evicted) == 4 and len(p) == 6, name
        assert not set(evicted) & set(p.keys_in_order()), name


def test_prefix_len_stops_at_first_miss():
    p = LRU(10)
    p.insert_many([1, 2, 4])
    assert p.prefix_len([1, 2, 3, 4]) == 2
    assert p.prefix_len([1, 2, 3, 4], 3) == 1
    assert p.prefix_len([9, 1]) == 0


def test_unknown_policy_lists_choices():
    with pytest.raises(ValueError, match="valid choices: lru, fifo, lfu, s3fifo, arc"):
        make_policy("mru", 4)


ops = st.lists(
    st.tuples(st.sampled_from(["insert", "touch", "shrink"]), st.lists(st.integers(0, 30), max_size=6, unique=True)),
    max_size=60,
)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 8), script=ops)
def test_policy_invariants(name, capacity, script):
    p = make_policy(name, capacity)
    for op, keys in script:
        before = set(p.keys_in_order())
        if op == "insert":
            evicted = p.insert_many(keys)
            after = set(p.keys_in_order())
            assert after <= before | set(keys)
            assert (before | set(keys)) - after <= set(evicted)  # nothing vanishes without an eviction
            assert set(evicted) <= before | set(keys)
            if keys:
                assert keys[-1] in p  # the newest key is never its own victim
        elif op == "touch":
            p.touch_many([k for k in keys if k in p])
            assert set(p.keys_in_order()) == before
        else:
            evicted = p.shrink_to(capacity // 2)
            assert set(p.keys_in_order()) == before - set(evicted)
        assert len(p) <= capacity
        assert len(p.keys_in_order()) == len(p)
        assert all(k in p for k in p.keys_in_order())

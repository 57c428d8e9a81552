"""The pure parts of the admission side by side (tests/e2e/overhead.py, `benchmarks/scheduler_bench.py`): the
cases' order round by round, the ratios of the rounds, and the table's lines."""

from __future__ import annotations

from tests.e2e.overhead import (
    _ORDERS,
    FLOOR,
    GPU_PLACEMENT,
    NO_WEBHOOK,
    AdmissionRound,
    admission_table,
    paired_ratios,
)


def test_the_do_nothing_webhook_and_gpu_placement_run_back_to_back_each_first_in_half_the_rounds() -> None:
    firsts = []
    for order in _ORDERS:
        assert sorted(order) == sorted((NO_WEBHOOK, FLOOR, GPU_PLACEMENT))
        floor, ours = order.index(FLOOR), order.index(GPU_PLACEMENT)
        assert abs(floor - ours) == 1, order
        firsts.append(FLOOR if floor < ours else GPU_PLACEMENT)
    assert firsts.count(FLOOR) == firsts.count(GPU_PLACEMENT)
    assert sorted(order.index(NO_WEBHOOK) for order in _ORDERS) == [0, 0, 2, 2]


def _round(case: str, number: int, seconds: float) -> AdmissionRound:
    return AdmissionRound(case, 100, seconds, [seconds / 100] * 100, {"webhook": 0.1}, 1.0, number)


def test_each_round_gives_its_own_ratio_and_the_table_its_median() -> None:
    results = [_round(NO_WEBHOOK, 0, 0.5), _round(FLOOR, 0, 1.0), _round(GPU_PLACEMENT, 0, 1.1),
               _round(GPU_PLACEMENT, 1, 3.0), _round(FLOOR, 1, 2.0), _round(NO_WEBHOOK, 1, 0.5),
               _round(NO_WEBHOOK, 2, 0.5), _round(GPU_PLACEMENT, 2, 1.0), _round(FLOOR, 2, 1.0)]
    assert [round(x, 2) for x in paired_ratios(results)] == [1.1, 1.5, 1.0]
    table = admission_table(results)
    # One slow round decides the ratio of the totals (5.1 s against 4.0 s), not the median of the rounds.
    assert "1.27x slower in creates/s (goal <= 1.2x: MISS)" in table
    assert "round by round (the two back to back): median 1.10x (PASS), 1.00-1.50x over 3 rounds" in table

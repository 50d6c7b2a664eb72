"""lists.fresh.Misses: a watch that left a consistent LIST behind is not tried for a while."""

from __future__ import annotations

from watchproxy.lists.fresh import Misses


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_miss_pauses_the_watch_for_a_second_then_it_is_tried_again() -> None:
    clock = Clock()
    misses: Misses[str] = Misses(clock)
    assert not misses.paused("pods")
    misses.missed("pods", 50)
    assert misses.paused("pods") and not misses.paused("configmaps")
    clock.now += 0.99
    assert misses.paused("pods")
    clock.now += 0.02
    assert not misses.paused("pods")


def test_misses_in_a_row_double_the_pause_up_to_a_minute_and_an_answer_ends_the_streak() -> None:
    clock = Clock()
    misses: Misses[str] = Misses(clock)
    pauses = []
    for revision in range(1, 10):
        misses.missed("pods", revision)
        start = clock.now
        while misses.paused("pods"):
            clock.now += 0.5
        pauses.append(clock.now - start)
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    misses.answered("pods")
    misses.missed("pods", 100)
    clock.now += 1.01
    assert not misses.paused("pods")


def test_the_lists_that_shared_one_probe_count_as_one_miss() -> None:
    clock = Clock()
    misses: Misses[str] = Misses(clock)
    for _ in range(20):
        misses.missed("pods", 50)  # 20 LISTs, one probe at 50
    clock.now += 1.01
    assert not misses.paused("pods")  # one miss: one second, not 2**19


def test_a_probe_without_a_revision_counts_as_a_miss_each_time() -> None:
    clock = Clock()
    misses: Misses[str] = Misses(clock)
    misses.missed("pods", None)
    misses.missed("pods", None)
    clock.now += 1.5
    assert misses.paused("pods")  # two in a row: two seconds


def test_closed_watches_are_forgotten() -> None:
    misses: Misses[str] = Misses(Clock())
    misses.missed("pods", 1)
    misses.missed("configmaps", 1)
    misses.forget(lambda watch: watch == "pods")
    assert len(misses) == 1 and misses.paused("pods")

"""The relay's linger after the apiserver ended a session (watchproxy.server.upgrade.Linger):
the client's connection stays open while the client makes progress, and no longer."""

from __future__ import annotations

from watchproxy.server.upgrade import LINGER_LOOK, Linger


def test_a_client_that_keeps_taking_bytes_is_waited_for_past_the_idle_time() -> None:
    linger = Linger(0.0, idle=5.0, limit=60.0)
    for second in range(60):  # 10 kB/s of 3 MB: five minutes' worth, cut at the limit only
        assert linger.next_look(float(second), 3_000_000 - 10_000 * second, 0) is not None
    assert linger.next_look(60.0, 2_400_000, 0) is None


def test_a_client_that_only_sends_is_making_progress() -> None:
    """Pings and window updates of a client still reading its own receive buffer (our send
    queue is empty already)."""
    linger = Linger(0.0, idle=5.0, limit=60.0)
    for second in range(20):
        assert linger.next_look(float(second), 0, second * 16) is not None


def test_a_client_that_makes_no_progress_is_closed_after_the_idle_time() -> None:
    linger = Linger(0.0, idle=5.0, limit=60.0)
    assert linger.next_look(0.0, 500_000, 0) == LINGER_LOOK
    assert linger.next_look(4.9, 500_000, 0) is not None
    assert linger.next_look(5.0, 500_000, 0) is None


def test_progress_restarts_the_idle_time_and_the_last_look_is_at_the_deadline() -> None:
    linger = Linger(0.0, idle=5.0, limit=60.0)
    assert linger.next_look(0.0, 100, 0) is not None
    assert linger.next_look(4.0, 50, 0) is not None  # progress at 4 s
    delay = linger.next_look(8.95, 50, 0)
    assert delay is not None and abs(delay - 0.05) < 1e-9  # due at 9 s
    assert linger.next_look(9.0, 50, 0) is None

import datetime as dt
import threading
import time

from kistexp.clock import UTC, Clock, RealClock, VirtualClock, as_utc

T0 = dt.datetime(2027, 3, 1, 12, 0, tzinfo=UTC)


def test_both_clocks_satisfy_the_protocol():
    assert isinstance(RealClock(), Clock)
    assert isinstance(VirtualClock(T0), Clock)


def test_as_utc_reads_naive_as_utc_and_posix_seconds():
    assert as_utc(dt.datetime(2027, 3, 1, 12)) == T0
    assert as_utc(T0.timestamp()) == T0


def test_virtual_clock_jumps_to_each_due_call_in_order():
    clock = VirtualClock(T0)
    seen = []
    clock.call_at(T0 + dt.timedelta(days=14), lambda: seen.append(("b", clock.now())))
    clock.call_at(T0 + dt.timedelta(hours=1), lambda: seen.append(("a", clock.now())))
    clock.call_at(T0 + dt.timedelta(days=14), lambda: seen.append(("c", clock.now())))
    started = time.monotonic()
    clock.sleep_until(T0 + dt.timedelta(days=30))
    assert time.monotonic() - started < 0.5  # two weeks pass instantly
    assert [s[0] for s in seen] == ["a", "b", "c"]  # ties keep scheduling order
    assert seen[0][1] == T0 + dt.timedelta(hours=1)
    assert seen[1][1] == T0 + dt.timedelta(days=14)
    assert clock.now() == T0 + dt.timedelta(days=30)
    assert clock.monotonic() == 30 * 86400


def test_virtual_calls_may_schedule_more_calls_and_cancel():
    clock = VirtualClock(T0)
    ticks = []

    def tick():
        ticks.append(clock.now())
        if len(ticks) < 5:
            clock.call_at(clock.now() + dt.timedelta(hours=1), tick)

    clock.call_at(T0, tick)
    doomed = clock.call_at(T0 + dt.timedelta(minutes=30), lambda: ticks.append("never"))
    doomed.cancel()
    clock.run_until(T0 + dt.timedelta(days=1))
    assert ticks == [T0 + dt.timedelta(hours=h) for h in range(5)]
    assert clock.next_due() is None
    assert not clock.step()


def test_virtual_clock_wakes_threads_driven_from_elsewhere():
    clock = VirtualClock(T0, auto_advance=False)
    woke = []

    def sleeper():
        clock.sleep_until(T0 + dt.timedelta(seconds=10))
        woke.append(clock.now())

    th = threading.Thread(target=sleeper)
    th.start()
    time.sleep(0.05)
    assert not woke  # time has not moved
    clock.advance(9)
    time.sleep(0.05)
    assert not woke
    clock.advance(1)
    th.join(timeout=2)
    assert woke == [T0 + dt.timedelta(seconds=10)]


def test_real_clock_sleeps_and_calls_at_wall_time():
    clock = RealClock()
    start = clock.now()
    assert abs((start - dt.datetime.now(UTC)).total_seconds()) < 1
    done = threading.Event()
    clock.call_at(start + dt.timedelta(seconds=0.1), done.set)
    clock.sleep_until(start + dt.timedelta(seconds=0.2))
    assert clock.now() >= start + dt.timedelta(seconds=0.2)
    assert done.wait(1)
    cancelled = threading.Event()
    clock.call_at(clock.now() + dt.timedelta(seconds=0.05), cancelled.set).cancel()
    time.sleep(0.15)
    assert not cancelled.is_set()

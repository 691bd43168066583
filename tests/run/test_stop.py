"""The stop signals' one path (autotune.run.stop), in this process: a Ctrl-C whose
``KeyboardInterrupt`` a library swallows is still kept, and the driver's next turn stops."""

from __future__ import annotations

import os
import signal

import pytest

from autotune.run import stop


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in stop.SIGNALS}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    stop._received.clear()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_swallowed_stop_is_raised_again_by_check(handlers, sig, code):
    stop.install(fresh=True)
    stop.check()  # nothing received: no stop
    try:  # a library that catches KeyboardInterrupt and goes on
        os.kill(os.getpid(), sig)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
        raise AssertionError("the signal raised nothing")
    except KeyboardInterrupt as e:
        assert isinstance(e, stop.Stopped) and e.signum == sig
    with pytest.raises(stop.Stopped) as info:
        stop.check()
    assert info.value.signum == sig
    assert stop.exit_code(info.value) == code and stop.name() == signal.Signals(sig).name


def test_a_second_signal_is_noted_not_raised_and_fresh_forgets(handlers, capsys):
    stop.install(fresh=True)
    with pytest.raises(stop.Stopped):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    os.kill(os.getpid(), signal.SIGINT)  # already stopping: the exports must get written
    for _ in range(1000):
        pass
    assert "already stopping" in capsys.readouterr().err
    stop.install()  # the driver's second install (after ray.init) keeps the stop
    assert stop.received() == signal.SIGINT
    stop.install(fresh=True)  # the next command in this process starts fresh
    assert stop.received() is None
    stop.check()


def test_check_looks_only_after_its_mark(handlers):
    """A driver run in a process that was stopped before (the tests, a notebook) is not
    stopped by that old signal, but by one that comes during its own run, even when the
    handler left from the first stop only notes it."""
    stop.install(fresh=True)
    with pytest.raises(stop.Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    since = stop.mark()
    stop.install()
    stop.check(since)  # the old stop is not this run's
    os.kill(os.getpid(), signal.SIGINT)  # noted by the handler the first stop left
    for _ in range(1000):
        pass
    with pytest.raises(stop.Stopped) as info:
        stop.check(since)
    assert info.value.signum == signal.SIGINT


def test_a_sigterm_during_ray_start_is_our_stop_not_rays_exit_15(handlers):
    """``ray.init`` installs ``sys.exit(signum)`` for SIGTERM from its first line: a SIGTERM
    during Ray's start-up (a slow box, a scheduler's stop) must still exit 143 with our stop."""
    import sys

    stop.install(fresh=True)
    with pytest.raises(stop.Stopped) as info:
        with stop.ray_start():
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as ray.init does
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
    assert info.value.signum == signal.SIGTERM and stop.exit_code(info.value) == 143
    assert stop.received() == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is stop._again  # ours again, already stopping
    with pytest.raises(SystemExit):  # any other exit goes through untouched
        with stop.ray_start():
            sys.exit(3)


def test_deferred_notes_a_stop_that_comes_mid_write_and_interruptible_raises_it(handlers, tmp_path):
    """The driver's loop asks and tells through SQLite: a stop raised mid-query once left
    Optuna's session holding a lock, and marking the trials in flight interrupted then failed
    ("database is locked", exit 1). Deferred, the writes finish and the stop comes after."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db")
    stop.install(fresh=True)
    since = stop.mark()
    with pytest.raises(stop.Stopped) as info:
        with stop.deferred():
            trial = study.ask()
            os.kill(os.getpid(), signal.SIGTERM)  # lands during the writes below
            for i in range(20):
                trial.set_user_attr(f"k{i}", i)
            study.tell(trial, 1.0)
            assert stop.received() == signal.SIGTERM  # noted, not raised
            with stop.interruptible(since):  # a wait for trials: the stop comes out at once
                raise AssertionError("entered a wait with a stop pending")
    assert info.value.signum == signal.SIGTERM
    assert [t.user_attrs["k19"] for t in study.get_trials()] == [19]
    study.enqueue_trial({})  # the database is not locked: the stop's own writes go through
    assert len(study.get_trials()) == 2


def test_interruptible_raises_a_stop_that_comes_inside_at_once(handlers):
    stop.install(fresh=True)
    since = stop.mark()
    with stop.deferred():
        with pytest.raises(stop.Stopped):
            with stop.interruptible(since):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
                raise AssertionError("the signal raised nothing")
        os.kill(os.getpid(), signal.SIGINT)  # a second signal, deferred or not: only noted
        for _ in range(1000):
            pass
    assert stop._deferring == [False]


def test_a_sigterm_whose_exit_ray_start_never_sees_is_still_the_stop(handlers):
    """Ray's handler's ``SystemExit`` raised inside a finalizer is printed and lost (a clean-clone
    CI run finished its whole study with exit 0 after a SIGTERM during ``ray.init``): the
    signal is read from the wakeup fd, noted on the way out, and the caller's check raises it."""
    stop.install(fresh=True)
    since = stop.mark()
    with stop.ray_start():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a handler whose stop is lost
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    assert stop.received() == signal.SIGTERM
    with pytest.raises(stop.Stopped) as info:
        stop.check(since)
    assert info.value.signum == signal.SIGTERM
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd given back


def test_ray_start_notes_nothing_when_no_signal_came(handlers):
    stop.install(fresh=True)
    with stop.ray_start():
        os.kill(os.getpid(), signal.SIGCHLD)  # not a stop signal
    assert stop.received() is None
    stop.check()

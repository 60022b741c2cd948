"""The collector pause: process-wide, nested and shared between threads, always restored; and the
start of our processes (ingest.startup)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from ingest import nogc, startup


@pytest.fixture(autouse=True)
def collector_enabled() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_paused_inside_and_running_again_after() -> None:
    with nogc.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_pauses_end_with_the_outermost() -> None:
    with nogc.paused():
        with nogc.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_still_ends_the_pause() -> None:
    with pytest.raises(KeyError), nogc.paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    with nogc.paused():
        pass
    assert not gc.isenabled()


def test_overlapping_pauses_in_two_threads_end_with_the_last() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with nogc.paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with nogc.paused():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.isenabled())  # the first thread's pause ended, this one still holds

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_the_commands_start_runs_without_the_collector_until_it_is_over() -> None:
    try:
        nogc.pause_startup()
        assert not gc.isenabled()
        with nogc.paused():  # a batch's pause begun during the start keeps the collector off ...
            nogc.started(freeze=False)
            assert not gc.isenabled()
        assert gc.isenabled()  # ... until it ends
        nogc.started()  # once only
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_start_that_never_opens_a_run_still_ends_with_the_collector_on() -> None:
    try:
        nogc.pause_startup()
        nogc.started(freeze=False)  # (the cli's _open_run, whatever happened)
        assert gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("entry", ["ingest.__main__", "ingest.engines.workers"])
def test_a_process_of_ours_begins_before_numpy_is_loaded(entry: str) -> None:
    """The ``ingest`` command and a worker set their start up (one BLAS thread: OpenBLAS reads it
    when numpy loads it; the collector paused) before their imports: the modules they start from
    load neither numpy nor pyarrow."""
    probe = f"import sys, {entry}; print(sorted({{'numpy', 'pyarrow'}} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_begin_pauses_the_collector_and_keeps_a_blas_setting_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    startup.begin()
    try:
        assert not gc.isenabled()
        assert os.environ["OPENBLAS_NUM_THREADS"] == "4"
    finally:
        nogc.started(freeze=False)
    assert gc.isenabled()

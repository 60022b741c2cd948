"""A catch-up's figures as the batch loop and an engine feed them (:mod:`ingest.progress`)."""

from __future__ import annotations

from ingest.core.ledger import TopicPartition
from ingest.progress import Progress, clock

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_the_figures_follow_a_catch_up_batch_by_batch_and_chunk_by_chunk() -> None:
    now = [100.0]
    progress = Progress("orders", "lake.orders", clock=lambda: now[0])
    progress.catching_up({A0: 0, A1: 50, B0: 10}, {A0: 400, A1: 250, B0: 110})

    start = progress.figures()
    assert start.lag == {"a": 600, "b": 100} and start.records == 0 and start.batch is None

    progress.planned(1, [(A0, 0, 200), (B0, 10, 110)])
    now[0] += 10
    progress.advanced(150, 15_000, 0)
    progress.advanced(150, 15_000, 2)
    midway = progress.figures()
    assert (midway.batch, midway.batch_planned, midway.batch_done, midway.chunks, midway.files) == (1, 300, 300, 2, 2)
    assert midway.rate == 30.0  # the batch in flight counts
    assert midway.eta_s == (700 - 300) / 30.0
    assert "batch 1: 300 of 300 records read, 2 chunks decoded, 2 files written" in midway.text()

    progress.ended(300, 30_000, [("a", 0, 0, 200), ("b", 0, 10, 110)])
    after = progress.figures()
    assert after.batch is None and after.records == 300 and after.bytes == 30_000
    assert after.lag == {"a": 400, "b": 0}
    assert progress.left() == {A0: 200, A1: 200, B0: 0}
    assert "lag 400 (a 400, b 0); ETA 0:13" in after.text()


def test_a_run_of_one_batch_aims_at_no_end() -> None:
    progress = Progress("orders", "t")
    progress.catching_up({}, None)
    progress.planned(1, [(A0, 0, 10)])
    figures = progress.figures()
    assert figures.lag is None and figures.eta_s is None and progress.left() is None
    assert "lag" not in figures.text() and figures.as_dict()["batch_planned"] == 10


def test_a_clock_reads_as_people_write_durations() -> None:
    assert [clock(5), clock(65), clock(3725), clock(None)] == ["0:05", "1:05", "1:02:05", "-"]

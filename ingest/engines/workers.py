"""Worker processes of the local engine, and their main (``python -m ingest.engines.workers FD``).

Why processes: confluent-kafka hands every message to Python as an object built under the GIL,
so one process reads Kafka on one core at most, however many cores decode and write. A worker
runs tasks (:func:`ingest.engines.tasks.run_task`): it reads its share of the batch's ranges, decodes,
writes data files, and returns their metadata. Only the engine's process commits.

Workers are plain subprocesses of this interpreter (not ``multiprocessing``): they start the same
way under Airflow's daemonic task processes, notebooks and scripts without a ``__main__`` guard.
Each talks over its own socket pair with :mod:`multiprocessing.connection` framing.

What a crash leaves:

* a worker that dies (OOM killer, SIGKILL) fails the batch with :class:`WorkerLost` (retryable);
  nothing was committed, and the files it wrote are orphans for ``ingest maintain``;
* if the engine's process dies, every worker exits within :data:`WATCH_S`: between tasks its
  socket reaches end-of-file, during a task a watchdog thread sees that its parent is gone.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from ingest import failpoints, nogc, startup
from ingest.errors import IngestError, WorkerLost

if TYPE_CHECKING:  # a worker imports them in main(), with the garbage collector paused
    from ingest.core.ranges import Range
    from ingest.engines.task_spec import TaskSpec
    from ingest.engines.tasks import TaskOutput
    from ingest.iceberg.table import IcebergTable
    from ingest.progress import Advanced
    from ingest.route_by.writing import RoutedTables

log = logging.getLogger(__name__)

#: how often a worker checks that the process that started it is alive
WATCH_S = 0.2


@dataclass(frozen=True)
class Task:
    """A share of a batch for a worker: read ``ranges``, write into ``rows``' location."""

    spec: TaskSpec
    rows: IcebergTable | RoutedTables
    index: int
    ranges: Sequence[Range]


class _Worker:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ingest.engines.workers", str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.connection = Connection(ours.detach())
        self.ready = False  # it says so once its imports are done

    def receive(self, when: str) -> tuple[str, Any]:
        """The worker's next message; :class:`WorkerLost` if it is gone (``when``: what it was doing)."""
        try:
            kind, payload = self.connection.recv()
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=WATCH_S * 5)  # for its exit status
            raise WorkerLost(
                f"{self.describe()} {when}; nothing was committed. Run again (lower batch.workers or "
                "batch.chunk_records if the machine is short of memory)."
            ) from None
        return kind, payload

    def poll_ready(self, timeout_s: float = 0.0) -> bool:
        """Whether the worker has said its imports are done (the first message it sends), waiting
        up to ``timeout_s`` for the word."""
        if not self.ready and self.connection.poll(timeout_s):
            self.receive("while it started")
            self.ready = True
        return self.ready

    def describe(self) -> str:
        code = self.process.poll()
        if code is None:
            return f"worker {self.process.pid} closed its connection"
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"worker {self.process.pid} {how}" + (" (SIGKILL: often the OOM killer)" if code == -9 else "")

    def stop(self, kill: bool, timeout_s: float = 5.0) -> None:
        if kill or not self.ready:  # a failed batch's work is of no use, nor are a starting worker's imports
            self.process.kill()
        self.connection.close()  # end-of-file: an idle worker exits
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Dispatch:
    """Hands tasks to workers as they become ready, and hears the busy ones (how far they are, the
    failpoints they reach, their outputs), from a thread of its own while the engine's process
    works on its own share."""

    def __init__(
        self,
        workers: Sequence[_Worker],
        hand_off: Callable[[int], Sequence[Task]],
        reach: Callable[[str], None],
        advanced: Advanced,
    ) -> None:
        self.hand_off, self.reach, self.advanced = hand_off, reach, advanced
        self.idle = [worker for worker in workers if worker.poll_ready()]  # some started in an earlier batch
        self.starting = {worker.connection: worker for worker in workers if not worker.ready}
        self.busy: dict[Connection, _Worker] = {}
        self.outputs: list[TaskOutput] = []
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="worker-dispatch", daemon=True)

    def assign(self) -> None:
        """Give each idle worker a task, as far as ``hand_off`` has any."""
        if not self.idle:
            return
        tasks = self.hand_off(len(self.idle))
        assert len(tasks) <= len(self.idle), (len(tasks), len(self.idle))
        for worker, task in zip(self.idle, tasks, strict=False):
            worker.connection.send(task)
            self.busy[worker.connection] = worker
        self.idle = self.idle[len(tasks) :]

    def start(self) -> None:
        if self.starting or self.busy:
            self._thread.start()

    def _serve(self) -> None:
        try:
            while (self.starting or self.busy) and not self._stopping.is_set():
                joined = False
                for connection in wait([*self.starting, *self.busy], timeout=0.05):
                    assert isinstance(connection, Connection)
                    if connection in self.busy:
                        self.hear(connection)
                        continue
                    worker = self.starting.pop(connection)
                    worker.poll_ready()  # wait() saw its word (or its end: WorkerLost)
                    self.idle.append(worker)
                    joined = True
                if joined and not self._stopping.is_set():
                    self.assign()
        except BaseException as error:  # raised by the engine's thread once its own share is done
            self.error = error

    def hear(self, connection: Connection) -> None:
        """A busy worker's next word: how far it is, a failpoint it reached, its output (it is then
        no longer busy) or its failure (raised here, with its kind and message)."""
        worker = self.busy[connection]
        kind, payload = worker.receive("during the batch")
        if kind == "advanced":
            self.advanced(*payload)
        elif kind == "reached":
            self.reach(payload)
        elif kind == "done":
            self.outputs.append(payload)
            del self.busy[connection]
        else:  # "failed": the task's own error
            error, text = payload
            log.debug("worker %d failed:\n%s", worker.process.pid, text)
            raise error

    def stop(self) -> None:
        """No more hand-offs: the engine's process has read its share."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def collect(self) -> list[TaskOutput]:
        """Once stopped: the busy workers' outputs, as each finishes."""
        while self.busy:
            for connection in wait(list(self.busy)):
                assert isinstance(connection, Connection)
                self.hear(connection)
        return self.outputs


class WorkerPool:
    """``size`` worker processes, started when first needed and kept for later batches."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._workers: list[_Worker] = []

    def start(self, count: int, timeout_s: float | None = None) -> None:
        """Start workers up to ``count`` now; with ``timeout_s``, return once each is ready."""
        try:
            while len(self._workers) < min(count, self.size):
                self._workers.append(_Worker())
            for worker in self._workers:
                if timeout_s is not None and not worker.poll_ready(timeout_s):
                    raise WorkerLost(f"worker {worker.process.pid} was not ready after {timeout_s:.0f}s")
        except BaseException:
            self.close(kill=True)
            raise

    def run(
        self,
        helpers: int,
        hand_off: Callable[[int], Sequence[Task]],
        reach: Callable[[str], None],
        advanced: Advanced,
        meanwhile: Callable[[], TaskOutput],
    ) -> list[TaskOutput]:
        """Run ``meanwhile()`` in this process while up to ``helpers`` workers join in: whenever
        some are ready and idle, ``hand_off(n)`` gives up to ``n`` tasks, one per worker. Workers
        already running get theirs before ``meanwhile`` starts; one started for this batch asks
        when its imports are done (seconds on a cold machine), so it takes a share of what is then
        left. ``mid-read`` and ``mid-write`` reached in workers are forwarded to ``reach``, and
        what they read and wrote to ``advanced``, as they go. On any failure every worker is killed
        (the next batch starts new ones) and the error is raised."""
        assert helpers <= self.size, (helpers, self.size)
        try:
            self.start(helpers)
            dispatch = _Dispatch(self._workers[:helpers], hand_off, reach, advanced)
            dispatch.assign()
            dispatch.start()
            try:
                own = meanwhile()
            finally:
                dispatch.stop()
            if dispatch.error is not None:
                raise dispatch.error
            return [own, *dispatch.collect()]
        except BaseException:
            self.close(kill=True)
            raise

    def close(self, kill: bool = False) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop(kill)


# --- the worker's side --------------------------------------------------------------------------


def _watch(parent: int) -> None:
    """Exit as soon as the process that started this one is gone (its pid is no longer our parent)."""
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os._exit(70)


def _serve(connection: Connection) -> None:
    from ingest.engines.tasks import run_task

    try:
        connection.send(("ready", None))
    except OSError:  # the pool closed while this process started
        return
    while True:
        try:
            task: Task = connection.recv()
        except EOFError:
            return  # the pool closed, or its process is gone

        def reach(point: str) -> None:
            failpoints.reach(point, failpoints.WORKER)
            connection.send(("reached", point))

        def advanced(records: int, nbytes: int, files: int) -> None:
            connection.send(("advanced", (records, nbytes, files)))

        try:
            output = run_task(task.spec, task.rows, task.index, task.ranges, reach, advanced)
        except Exception as error:
            text = traceback.format_exc()
            if not isinstance(error, IngestError):  # a bug: keep where it happened
                error = RuntimeError(f"a worker's task failed (nothing was committed):\n{text}")
            connection.send(("failed", (error, text)))
            continue
        connection.send(("done", output))


def main(argv: Sequence[str]) -> None:
    fd, parent = int(argv[0]), int(argv[1])
    # Ctrl-C and a SIGTERM to the process group (Airflow's killpg, systemd) reach every worker: the
    # engine's process decides (it finishes the batch in flight on SIGTERM); its death ends us (_watch)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s worker {os.getpid()} %(levelname)s %(message)s")
    # imports build a few hundred thousand objects, none of them garbage: the collector waits (as
    # the ingest command's own start does), and what they built is frozen out of its walks
    startup.begin()
    importlib.import_module("ingest.engines.tasks")
    importlib.import_module("ingest.iceberg.table")  # a task holds its table: pyiceberg is loaded before "ready"
    nogc.started()
    _serve(Connection(fd))
    # The pool closed: every task's output was sent, and this process holds nothing else. Tearing
    # down its interpreter (modules, pyiceberg's and Arrow's objects) took ~0.15 s that the
    # engine's process waited out at the end of every run.
    logging.shutdown()
    with contextlib.suppress(OSError, ValueError):  # (a closed or broken stream: nothing to keep)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

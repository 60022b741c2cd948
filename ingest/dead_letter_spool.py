"""A batch's dead letters held LZ4-compressed from the moment they are decoded until they are written.

A batch of poison is mostly its raw values and the same few reasons, which LZ4 takes to about a
quarter at some GB/s. Held as Arrow tables, the dead letters of a 2M-record batch all poison
cost ~450 MB in each process that held them, twice in the engine's process while they crossed
from the tasks; spooled, ~120 MB, and they are decompressed a group at a time to be written
(:meth:`DeadLetterSpool.groups`). The spool crosses process boundaries as it is (worker
processes, Spark executors): its parts are Arrow IPC streams.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

_STREAM = pa.ipc.IpcWriteOptions(compression="lz4")

#: dead letters decompressed together to be written: a file's worth, well under a batch's budget
GROUP_BYTES = 64 << 20


class DeadLetterSpool:
    """Dead letters (schema ``DEAD_LETTER_SCHEMA``) in compressed parts, in the order added."""

    def __init__(self, parts: Iterable[tuple[bytes, int, int]] = ()) -> None:
        #: each part: an LZ4-compressed Arrow IPC stream, its rows, its bytes decompressed
        self._parts = list(parts)

    @classmethod
    def of(cls, *tables: pa.Table) -> DeadLetterSpool:
        spool = cls()
        for table in tables:
            spool.add(table)
        return spool

    @classmethod
    def joined(cls, spools: Iterable[DeadLetterSpool]) -> DeadLetterSpool:
        """The parts of ``spools``, in their order (none is decompressed)."""
        return cls(part for spool in spools for part in spool._parts)

    def add(self, table: pa.Table) -> None:
        """``table``'s rows, compressed now (none: nothing to add)."""
        if table.num_rows == 0:
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=_STREAM) as writer:
            writer.write_table(table)
        self._parts.append((sink.getvalue().to_pybytes(), table.num_rows, table.nbytes))

    @property
    def num_rows(self) -> int:
        return sum(rows for _, rows, _ in self._parts)

    def groups(self, max_bytes: int = GROUP_BYTES) -> Iterator[pa.Table]:
        """The dead letters in order, as tables of at most ``max_bytes`` decompressed (or one part,
        if larger): only one group is decompressed at a time."""
        held: list[pa.Table] = []
        size = 0
        for data, _, nbytes in self._parts:
            if held and size + nbytes > max_bytes:
                yield pa.concat_tables(held)
                held, size = [], 0
            held.append(_table(data))
            size += nbytes
        if held:
            yield pa.concat_tables(held)

    def commonest_reasons(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` commonest reasons, with how many dead letters give each."""
        counts: Counter[str] = Counter()
        for data, _, _ in self._parts:
            for found in pc.value_counts(_table(data)["error"]).to_pylist():
                counts[found["values"]] += found["counts"]
        return counts.most_common(n)


def _table(part: bytes) -> pa.Table:
    return pa.ipc.open_stream(part).read_all()

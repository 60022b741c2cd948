"""What expiry may remove (ingest.core.expiry), on random histories with branches, tags and ledgers.

Expiry is simulated as Iceberg applies it: the doomed snapshots go, and a survivor whose parent
went loses its parent link (the ledger lookup's walk ends there).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import event, given
from hypothesis import strategies as st

from ingest.core.expiry import MAIN, Ref, doomed, protected
from ingest.core.ledger import BatchCounts, Ledger, SnapshotView, TopicPartition
from ingest.core.ledger_codec import encode, find_ledger

PIPELINES = ("orders", "refunds")
TP = TopicPartition("t", 0)


@dataclass
class History:
    snapshots: dict[int, SnapshotView]
    parents: dict[int, int | None]
    refs: list[Ref]

    @property
    def registered(self) -> list[str]:
        """Pipelines that committed (the table property lists every one that ever did)."""
        return [p for p in PIPELINES if any(find_ledger(p, [s]) for s in self.snapshots.values())]

    def ancestry(self, head: int) -> list[SnapshotView]:
        found = []
        current: int | None = head
        while current is not None and current in self.snapshots:
            found.append(self.snapshots[current])
            current = self.parents[current]
        return found

    def expire(self, ids: list[int]) -> History:
        gone = set(ids)
        return History(
            {i: s for i, s in self.snapshots.items() if i not in gone},
            {i: (None if p in gone else p) for i, p in self.parents.items() if i not in gone},
            self.refs,
        )

    def head(self, name: str) -> int:
        return next(r.snapshot_id for r in self.refs if r.name == name)


@st.composite
def histories(draw: st.DrawFn) -> History:
    snapshots: dict[int, SnapshotView] = {}
    parents: dict[int, int | None] = {}
    batches = dict.fromkeys(PIPELINES, 0)

    def add(parent: int | None) -> int:
        sid = len(snapshots) + 1
        owner = draw(st.sampled_from([*PIPELINES, None]))
        summary: dict[str, str] = {}
        if owner is not None:
            batches[owner] += 1
            summary = encode(owner, Ledger(batch=batches[owner], offsets={TP: batches[owner]}), BatchCounts())
        snapshots[sid] = SnapshotView(sid, summary, timestamp_ms=sid * 1000)
        parents[sid] = parent
        return sid

    main = [add(None)]
    for _ in range(draw(st.integers(0, 12))):
        main.append(add(main[-1]))
    refs = [Ref(MAIN, main[-1], True)]
    for b in range(draw(st.integers(0, 3))):
        fork = draw(st.sampled_from(main))
        head = fork
        for _ in range(draw(st.integers(0, 4))):
            head = add(head)
        refs.append(Ref(f"replay-{fork}-{b}", head, True))
    for t in range(draw(st.integers(0, 2))):
        refs.append(Ref(f"tag-{t}", draw(st.sampled_from(sorted(snapshots))), False))
    return History(snapshots, parents, refs)


@given(histories(), st.integers(1, 4))
def test_expiry_keeps_refs_ledgers_on_every_branch_and_every_fork(history: History, keep_last: int) -> None:
    keep = protected(history.refs, history.ancestry, history.registered)
    gone = doomed(list(history.snapshots.values()), keep, keep_last, cutoff_ms=10**12)
    after = history.expire(gone)
    event(f"expired some: {bool(gone)}")

    main_line = {s.snapshot_id for s in after.ancestry(after.head(MAIN))}
    for ref in history.refs:
        assert ref.snapshot_id in after.snapshots, ref
        if not ref.is_branch:
            continue
        for name in history.registered:
            assert find_ledger(name, after.ancestry(ref.snapshot_id)) == find_ledger(
                name, history.ancestry(ref.snapshot_id)
            ), (ref, name)
        if ref.name != MAIN:  # publish can still tell what main gained since the fork
            assert any(s.snapshot_id in main_line for s in after.ancestry(ref.snapshot_id)), ref


@given(histories())
def test_expiry_only_removes_what_is_old_enough_and_beyond_the_newest(history: History) -> None:
    keep = protected(history.refs, history.ancestry, history.registered)
    cutoff = 5_500
    gone = doomed(list(history.snapshots.values()), keep, 2, cutoff)

    newest = sorted(history.snapshots.values(), key=lambda s: s.timestamp_ms)[-2:]
    assert all(history.snapshots[i].timestamp_ms < cutoff for i in gone)
    assert not set(gone) & ({s.snapshot_id for s in newest} | keep)


def test_a_replay_branch_keeps_mains_line_back_to_its_fork() -> None:
    ledger = encode("orders", Ledger(batch=1, offsets={TP: 1}), BatchCounts())
    views = {i: SnapshotView(i, ledger if i in (1, 5, 6) else {}, i) for i in range(1, 7)}
    # main: 1 <- 2 <- 3 <- 4 <- 5 ; branch: 1 <- 6 (a replay from snapshot 1)
    history = History(views, {1: None, 2: 1, 3: 2, 4: 3, 5: 4, 6: 1}, [Ref(MAIN, 5, True), Ref("replay-1", 6, True)])

    keep = protected(history.refs, history.ancestry, ["orders"])

    assert keep == {1, 2, 3, 4, 5, 6}
    assert protected([Ref(MAIN, 5, True)], history.ancestry, ["orders"]) == {5}

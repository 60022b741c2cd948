"""A compaction's commit that also removes delete files (:class:`ingest.intents.Rewrite` with
``deletes``): ``ingest maintain`` rewrites the data files a changelog's row deltas deleted from by
position with their live rows only (:func:`ingest.iceberg.files.read_live`), and removes the
delete files that named them alone in the same snapshot, so readers stop merging them. Delete files
that name other files too (another tool's) stay: they match nothing once their files are gone, as
Spark's ``rewrite_data_files`` leaves them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestFile,
)
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT

from ingest.iceberg.row_delta import DeleteManifestWriter


def stage_rewrite(
    transaction: Transaction,
    table: Table,
    branch: str,
    summary: dict[str, str],
    remove: Sequence[DataFile],
    deletes: Sequence[DataFile],
    added: Sequence[DataFile],
) -> int:
    """Stage a compaction on ``branch`` of ``table`` that replaces data files ``remove`` by ``added``
    and removes delete files ``deletes`` (:class:`ingest.intents.Rewrite`)."""
    producer = _RewriteProducer(transaction, table.io, summary, branch, deletes)
    with producer:
        for removed in remove:
            producer.delete_data_file(removed)
        for data_file in added:
            producer.append_data_file(data_file)
    return producer.snapshot_id


class _RewriteProducer(_OverwriteFiles):
    """pyiceberg's overwrite (as the other compactions are) that also drops delete files from the delete
    manifests (pyiceberg rewrites data manifests only)."""

    def __init__(
        self, transaction: Transaction, io: FileIO, summary: dict[str, str], branch: str, deletes: Sequence[DataFile]
    ) -> None:
        super().__init__(Operation.OVERWRITE, transaction, io, snapshot_properties=summary, branch=branch)
        self._dropped = {d.file_path for d in deletes}
        self._dropped_files = list(deletes)

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # the delete files counted as removed, as pyiceberg counts removed data files
        deleted = self._deleted_data_files
        self._deleted_data_files = {*deleted, *self._dropped_files}
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._deleted_data_files = deleted

    def _existing_manifests(self) -> list[ManifestFile]:
        kept: list[ManifestFile] = []
        for manifest in super()._existing_manifests():
            if manifest.content != ManifestContent.DELETES:
                kept.append(manifest)
                continue
            entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
            staying = [e for e in entries if e.data_file.file_path not in self._dropped]
            if len(staying) == len(entries):
                kept.append(manifest)
                continue
            if not staying:
                continue
            with DeleteManifestWriter.of(self, manifest.partition_spec_id) as writer:
                for entry in staying:
                    writer.existing(entry)
            kept.append(writer.to_manifest_file())
        return kept

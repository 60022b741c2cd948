"""``route_by``: a field's (or a header's) value picks the table each record goes to.

- :mod:`~ingest.route_by.decoding` marks each row with the table its value names (``Routing``, a
  decoder around the format's); a record whose value is missing, not allowed, or cannot name a
  table becomes a dead letter saying so.
- :mod:`~ingest.route_by.writing` splits the rows by that mark into each table's data files
  (``RoutedTables``), leaving out the rows a table holds already: those below its *floor*, the
  ledger the table's own snapshots carry.
- :mod:`~ingest.route_by.tables` holds the tables a pipeline routes to (``Routes``): it opens and
  creates them, reads their floors as a batch's files are cut, and commits each with its floor
  moved to the batch's end before the pipeline's ledger table is (see
  :meth:`ingest.pipeline.Pipeline._attempt`).

A table no record named before is created when a batch first routes records to it: the tasks
report it missing (:attr:`ingest.ports.Produced.missing`), and the batch is produced again. A table
that exists but cannot take the pipeline's rows (another partition spec, properties or sort order, a
schema it cannot evolve to) is *refused* for the batch: the records routed to it are dead letters
saying why, but for those below its floor (it holds them).
"""

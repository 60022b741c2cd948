"""The batch loop's ports in memory, for tests of the protocol and for anyone checking their own
integration against it: a ledger table with lost acknowledgements, crashes and foreign commits
(:mod:`ingest.testing.memory_table`), and a Kafka source and a Schema Registry whose contents a
test sets (:mod:`ingest.testing.memory_kafka`). Both Hypothesis state machines run the real
:meth:`ingest.pipeline.Pipeline.run_batch` on them."""

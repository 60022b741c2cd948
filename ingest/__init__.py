"""lakehouse-ingest: exactly-once Kafka to Apache Iceberg micro-batches."""

__version__ = "0.1.0"

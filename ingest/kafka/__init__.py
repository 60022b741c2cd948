"""Kafka adapter: the source (its clients and their settings, exact range reads, raw chunks), the
Schema Registry client, and the admin and producer helpers of the demo and tests."""

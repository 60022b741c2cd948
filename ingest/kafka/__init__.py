"""Kafka adapter: reading exact offset ranges, and the admin and producer helpers of the demo and tests."""

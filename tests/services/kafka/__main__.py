"""``python -m tests.services.kafka resolve``: fetch Apache Kafka's jars from Maven Central into .cache/."""

from __future__ import annotations

import sys

from tests.services.kafka import KafkaUnavailable, describe, resolve

if __name__ == "__main__":
    if sys.argv[1:] != ["resolve"]:
        sys.exit("usage: python -m tests.services.kafka resolve")
    try:
        print(f"{describe()}: {resolve()}")
    except KafkaUnavailable as error:
        sys.exit(f"Apache Kafka is not available: {error}")

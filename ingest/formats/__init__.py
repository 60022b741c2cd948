"""Record value formats: each decodes Kafka values into rows of the table's schema (the ValueDecoder port)."""

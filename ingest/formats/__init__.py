"""Record formats: each turns chunks of Kafka values (or keys) into rows of the table's fields
(:class:`ingest.ports.ValueDecoder`), and the registry formats map a writer schema to fields.

The formats by name, with what each can do, are :data:`ingest.format_names.FORMATS`; how each
one's decoders are made, under the same names, is :data:`ingest.formats.decoders.DECODERS`.
"""

"""The Schema Registry, through confluent-kafka's ``SchemaRegistryClient`` (any registry serving
the Confluent REST API: Confluent's, Apicurio's ``/apis/ccompat/v7``, Redpanda's, Karapace).

Its failures are sorted as the rest of the pipeline sorts them: a registry that does not answer is
retryable (:class:`RegistryUnavailable`, never a dead letter: the records are fine), one that
turns this client away is a configuration error (:class:`RegistryRefused`), and an id it does not
know is the record's problem (``by_id`` returns None: a dead letter).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from ingest.errors import RegistryRefused, RegistryUnavailable, SubjectNotFound
from ingest.ports import WriterSchema

T = TypeVar("T")

#: seconds a request to the registry may take before it is retried: confluent-kafka's client waits
#: forever by default, and a request stuck on a reused connection then hangs the run (seen with
#: Apicurio 3.3.3, about once in a few hundred requests)
REQUEST_TIMEOUT_S = 10
#: the Confluent API's error codes for an unknown subject, version or schema id
_NOT_FOUND = {40401, 40402, 40403}


class Registry:
    """A :class:`ingest.ports.SchemaRegistry` at ``conf["url"]``; schemas by id are cached (they never change)."""

    def __init__(self, conf: Mapping[str, str | int | float | bool]) -> None:
        self.url = str(conf["url"])
        settings: dict[str, Any] = {"timeout": REQUEST_TIMEOUT_S, "max.retries": 2, **conf}
        self._client = SchemaRegistryClient(settings)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except SchemaRegistryError as error:
            if error.http_status_code in (401, 403):
                raise RegistryRefused(
                    f"the Schema Registry at {self.url} refused this client ({error.http_status_code}: "
                    f"{error.error_message}) while {what}. Check `schema_registry:` in the config "
                    "(basic.auth.user.info or bearer.auth.* credentials, usually ${ENV} references). "
                    "Retrying will not help."
                ) from None
            if error.http_status_code == 404 or error.error_code in _NOT_FOUND:
                raise
            raise RegistryUnavailable(
                f"the Schema Registry at {self.url} failed while {what}: {error.http_status_code} "
                f"{error.error_message}. Nothing was committed; run again."
            ) from None
        except Exception as error:  # the HTTP client's transport errors (refused, timed out, DNS)
            raise RegistryUnavailable(
                f"cannot reach the Schema Registry at {self.url} while {what}: {error}. Nothing was committed; "
                "run again when it is reachable."
            ) from None

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (one registry per run or task: bounded)
    def by_id(self, schema_id: int) -> WriterSchema | None:
        try:
            schema = self._call(f"fetching schema id {schema_id}", lambda: self._client.get_schema(schema_id))
            if schema.schema_type == "PROTOBUF":  # as a serialized FileDescriptorProto, which needs no .proto parser
                what = f"fetching schema id {schema_id} serialized"
                schema = self._call(what, lambda: self._client.get_schema(schema_id, fmt="serialized"))
        except SchemaRegistryError:
            return None
        return self._writer(schema_id, schema, f"schema id {schema_id}")

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (as by_id)
    def _version(self, subject: str, version: int) -> WriterSchema:
        """A referenced schema, ``version`` of ``subject``, read by its id as any writer schema is
        (Apicurio 3.3.3 cannot serve a Protobuf version serialized, only a schema id)."""
        what = f"reading version {version} of subject {subject!r}"
        try:
            found = self._call(what, lambda: self._client.get_version(subject, version, True))
        except SchemaRegistryError:
            found = None
        writer = self.by_id(found.schema_id) if found is not None and found.schema_id is not None else None
        if writer is None:
            raise RegistryRefused(
                f"the Schema Registry at {self.url} has no version {version} of subject {subject!r}, which a "
                "writer schema refers to: deleted for good, or the reference registered wrong. Restore it in the "
                "registry; the records that need it stay in Kafka until then."
            )
        return writer

    def _writer(self, schema_id: int, schema: Schema, what: str) -> WriterSchema:
        references = []
        for reference in schema.references or ():
            if not (reference.name and reference.subject and reference.version is not None):
                raise RegistryRefused(f"{what} has a reference without a name, subject or version: {reference}")
            references.append((reference.name, self._version(reference.subject, reference.version)))
        return WriterSchema(schema_id, schema.schema_type or "AVRO", schema.schema_str or "", tuple(references))

    def latest(self, subject: str) -> WriterSchema:
        try:
            found = self._call(f"reading subject {subject!r}", lambda: self._client.get_latest_version(subject))
        except SchemaRegistryError:
            raise SubjectNotFound(
                f"the Schema Registry at {self.url} has no subject {subject!r}, which the table's schema is derived "
                "from. Register the topic's schema first, set `subject:` on the topic, or declare `schema:`."
            ) from None
        if found.schema_id is not None:
            by_id = self.by_id(found.schema_id)
            if by_id is not None:
                return by_id
        return self._writer(found.schema_id or 0, found.schema, f"the latest version of subject {subject!r}")


def avro_serializer(url: str, schema: str, topic: str) -> Callable[[Mapping[str, Any]], bytes]:
    """Values as a producing service writes them: confluent-kafka's ``AvroSerializer`` (Confluent wire
    format), registering ``schema`` under ``<topic>-value`` (for the demo and the notebook)."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": url, "timeout": REQUEST_TIMEOUT_S})
    serializer = AvroSerializer(client, schema, conf={"auto.register.schemas": True})
    context = SerializationContext(topic, MessageField.VALUE)
    return lambda value: serializer(dict(value), context)  # type: ignore[no-any-return]

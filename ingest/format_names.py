"""The formats a topic's record values and keys may be in, by the names a config gives them
(``format:``, ``key_format:``), and what each can do: the one list of formats.

The config's accepted values (:data:`ValueFormat`, :data:`KeyFormat`) and the registry formats
(:data:`REGISTRY_FORMATS`) are derived from :data:`FORMATS`; :mod:`ingest.formats.decoders` makes
each format's decoders under the same names, and refuses to import if the two disagree. A new
format is a row here and its decoders there (see docs/development.md, "Adding a format").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal


@dataclass(frozen=True)
class Format:
    """A format of record values or keys."""

    #: as a config names it (``format: avro``)
    name: str
    #: as messages name it (``this topic is read as Avro``)
    label: str
    #: the Schema Registry's type of its writer schemas (``AVRO``, ``PROTOBUF``, ``JSON``) for a
    #: format in the Confluent wire format (a zero magic byte, the writer schema's id, the body);
    #: None: read without a registry
    registry_kind: str | None = None
    #: a topic's values may be in it (``format:``)
    values: bool = True
    #: a topic's keys may be in it (``key_format:``)
    keys: bool = False
    #: its values may instead be plain bodies of the writer schema in a file (``schema_file:``), no registry
    schema_file: bool = False

    @property
    def registry(self) -> bool:
        """Whether its writer schemas are fetched by id from a Schema Registry."""
        return self.registry_kind is not None


#: every format, in the order messages list them
FORMATS = (
    Format("json", "JSON"),
    Format("string", "UTF-8 text", values=False, keys=True),
    Format("avro", "Avro", "AVRO", keys=True, schema_file=True),
    Format("protobuf", "Protobuf", "PROTOBUF", keys=True),
    Format("json_schema", "JSON Schema", "JSON", keys=True),
)
#: each format by its name
FORMAT = {f.name: f for f in FORMATS}
#: each registry format by its writer schemas' type in the registry
BY_REGISTRY_KIND = {f.registry_kind: f for f in FORMATS if f.registry_kind is not None}

VALUE_FORMATS = tuple(f.name for f in FORMATS if f.values)
KEY_FORMATS = tuple(f.name for f in FORMATS if f.keys)
#: value and key formats read through a Schema Registry
REGISTRY_FORMATS = tuple(f.name for f in FORMATS if f.registry)
#: value formats that may be read from a writer schema file instead
SCHEMA_FILE_FORMATS = tuple(f.name for f in FORMATS if f.schema_file)

if TYPE_CHECKING:  # a Literal built from the table is a runtime value mypy cannot read: a name is a str to it
    ValueFormat = str
    KeyFormat = str
else:  # what pydantic checks ``format:`` and ``key_format:`` against (its message lists them in this order)
    ValueFormat = Literal[VALUE_FORMATS]
    KeyFormat = Literal[KEY_FORMATS]


def spoken(names: Iterable[str]) -> str:
    """``a, b or c``: names as a message lists them."""
    *rest, last = names
    return f"{', '.join(rest)} or {last}" if rest else last


#: what a batch does with records whose writer schema the table does not have
OnSchemaChange = Literal["evolve", "fail", "dead_letter"]

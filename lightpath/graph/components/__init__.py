"""The component library and the contract a folded process calls (GF-5).

One module per family of lightpath.graph.kinds.LIBRARY:

    base        the contract (Component, Source, Context, Blip, ReturnCode),
                records and the helpers every family shares
    files       file_input, file_output (FileReader, FileWriter)
    records     filter, reformat, replicate, gather
    aggregate   hash_rollup, sort (buffer until shutdown)
    interface   interface (an external program)
    kv_lookup   kv_lookup (an external service, in two halves)

Here: the kind → class tables the executor builds components from, the
partition function of repartitioning flows, and every public name of the
families, so `from lightpath.graph.components import …` stays as it was.
"""

from __future__ import annotations

import zlib

from lightpath.graph.components.aggregate import HashRollup, Sort
from lightpath.graph.components.base import (
    BATCH,
    Blip,
    Component,
    ComponentError,
    Context,
    Emit,
    EmitBatch,
    Record,
    ReturnCode,
    Source,
    discard_batch,
    first_bad_line,
    numbers,
    record_parser,
    record_size,
)
from lightpath.graph.components.files import FileInput, FileOutput, FileReader, FileWriter
from lightpath.graph.components.interface import Interface
from lightpath.graph.components.kv_lookup import KvLookupRequest, KvLookupResponse
from lightpath.graph.components.records import Filter, Gather, Reformat, Replicate

LIBRARY_CLASSES: dict[str, type[Component]] = {
    "file_input": FileInput,
    "file_output": FileOutput,
    "filter": Filter,
    "reformat": Reformat,
    "replicate": Replicate,
    "gather": Gather,
    "hash_rollup": HashRollup,
    "sort": Sort,
    "interface": Interface,
}
SPLIT_CLASSES: dict[str, tuple[type[Component], type[Component]]] = {
    "kv_lookup": (KvLookupRequest, KvLookupResponse),
}


def partition_of(key: str, partitions: int) -> int:
    """Target partition of a repartitioning flow: stable across processes (unlike hash())."""
    return zlib.crc32(key.encode()) % partitions


__all__ = [
    "BATCH",
    "LIBRARY_CLASSES",
    "SPLIT_CLASSES",
    "Blip",
    "Component",
    "ComponentError",
    "Context",
    "Emit",
    "EmitBatch",
    "FileInput",
    "FileOutput",
    "FileReader",
    "FileWriter",
    "Filter",
    "Gather",
    "HashRollup",
    "Interface",
    "KvLookupRequest",
    "KvLookupResponse",
    "Record",
    "Reformat",
    "Replicate",
    "ReturnCode",
    "Sort",
    "Source",
    "discard_batch",
    "first_bad_line",
    "numbers",
    "partition_of",
    "record_parser",
    "record_size",
]

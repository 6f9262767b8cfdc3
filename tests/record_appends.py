"""Tuning records appended from a process of its own (``test_tune``'s concurrent appends): the target of a spawned
process lives here, in a module that imports ``prnn_tvm.records`` alone, so that the process does not import the
test module and with it TVM (~4 s of CPU a process)."""

from prnn_tvm import records


def append_each(path, batches) -> None:
    """``records.append(path, batch)`` for each batch of records, in order."""
    for batch in batches:
        records.append(path, batch)

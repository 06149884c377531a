"""The engine's columnar and speed code: the only place that imports numpy, numba, llvmlite,
pyarrow or ctypes, or tunes the allocator and the garbage collector (tests/unit/test_layering.py).

Everything here has a plain counterpart that tests compare it with byte for byte: the batch
splice against mongoformats.oplog_splice's one-entry splice, an EventBlock's events against
the same events as tuples.
"""

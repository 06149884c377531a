"""Pure MongoDB formats: wire framing, KeyString resume tokens, oplog-to-event transform, error
codes.

No I/O, no trio and no numpy, numba or pyarrow anywhere in this package: stdlib, bson and the
compression libraries only (tests/unit/test_layering.py enforces it; the engine's columnar speed
code is buckets/_columnar). Every other package of the project imports it and it imports none
of them. The package imports nothing itself: import what you need from its module.
"""

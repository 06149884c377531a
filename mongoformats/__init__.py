"""Pure MongoDB formats: wire framing, KeyString resume tokens, oplog-to-event transform, error codes.

No I/O and no trio anywhere in this package (tests/test_layering.py enforces it); every other
package of the project imports it and it imports none of them. The package imports nothing
itself, so that a module such as `mongoformats.wire` loads without the event transform's
compiled kernels: import what you need from its module.
"""

"""Pure MongoDB formats: wire framing, KeyString resume tokens, oplog-to-event transform, error codes.

No I/O and no trio anywhere in this package (tests/test_layering.py enforces it); every other
package of the project imports it and it imports none of them.
"""

from mongoformats.change_events import ChangeEvent, OplogTransformer, ddl_note, invalidate_event
from mongoformats.errors import MongoError, ProtocolError, code_name, is_resumable_change_stream_error
from mongoformats.resume_token import (
    EVENT_TOKEN,
    HIGH_WATER_MARK,
    ResumeTokenData,
    decode_token,
    encode_token,
    high_water_mark,
    token_sort_key,
)
from mongoformats.wire import (
    NEED_DATA,
    MessageFramer,
    OpMsg,
    OpQuery,
    OpReply,
    encode_op_msg,
    encode_op_reply,
)

__all__ = [
    "ChangeEvent", "OplogTransformer", "ddl_note", "invalidate_event",
    "MongoError", "ProtocolError", "code_name", "is_resumable_change_stream_error",
    "EVENT_TOKEN", "HIGH_WATER_MARK", "ResumeTokenData", "decode_token", "encode_token", "high_water_mark",
    "token_sort_key",
    "NEED_DATA", "MessageFramer", "OpMsg", "OpQuery", "OpReply", "encode_op_msg", "encode_op_reply",
]

"""How the project decodes BSON it did not write: users' documents, which may hold any BSON value.

Dates outside Python's datetime range (years 1 to 9999; BSON allows ±292 million years) decode
as `DatetimeMS` instead of failing the decode, and so the stream that met them (pymongo's
default raises InvalidBSON). They encode back to the same bytes.
"""

from __future__ import annotations

from typing import Any

from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

__all__ = ["PLAIN", "RAW"]

# Nested documents stay raw slices; UUIDs decode as bson.Binary subtype 4 (the server's bytes).
RAW: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
# Fully decoded into dicts (types kept: Int64 stays Int64). Typed Any: callers take it as the
# Mapping or dict they need (CodecOptions is invariant in its document type).
PLAIN: CodecOptions[Any] = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)

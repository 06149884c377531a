"""What a mongod's catalog makes of the options and index specs it is given, as its oplog shows
them.

- Collection options: `CollectionOptions::appendBSON` (src/mongo/db/catalog/collection_options.cpp)
  writes them in a fixed order and with fixed types, whatever order the create command used;
  `fromCreateCommand` rounds a capped size up to a multiple of 256 (adjustCappedSize). The create
  entry (`MutableOplogEntry::makeCreateCommand`, op_observer_impl.cpp) is `{create: name,
  <options>, idIndex}` and carries the _id index only for index versions >= 2; a clustered
  collection has none.
- Index specs: `IndexCatalogImpl::_fixIndexSpec` (index_catalog_impl.cpp) rebuilds every spec as
  `v, unique?, hidden?, prepareUnique?, key, name, <the rest>`; createIndexes, commitIndexBuild and
  the dropIndexes o2 all show that layout.
"""

from __future__ import annotations

from typing import Any

from bson import Int64

__all__ = [
    "catalog_options",
    "create_entry_o",
    "expand_collation",
    "fix_index_spec",
    "index_name",
    "modified_index_spec",
    "options_before_change",
    "view_document",
]

# CollectionOptions::appendBSON's order (7.0: changeStreamPreAndPostImages after recordPreImages,
# expireAfterSeconds after clusteredIndex); options it does not know keep their order after these.
_ORDER = (
    "capped",
    "size",
    "max",
    "autoIndexId",
    "temp",
    "recordPreImages",
    "changeStreamPreAndPostImages",
    "storageEngine",
    "indexOptionDefaults",
    "validator",
    "validationLevel",
    "validationAction",
    "collation",
    "clusteredIndex",
    "expireAfterSeconds",
    "viewOn",
    "pipeline",
    "timeseries",
)

# ICU's defaults for a collation's attributes (CollationSpec, collation_spec.h), in the order the
# server's CollatorInterfaceICU::getSpec().toBSON() writes them; "version" is the ICU version 7.0
# and 8.0 ship (57.1). Only locales whose ICU tailoring changes none of these defaults are
# expanded (`_ROOT_DEFAULT_LOCALES`); others (fr_CA's backwards, da's caseFirst, ...) are left as
# given, since their defaults come from ICU's locale data, which the simulator does not carry.
_COLLATION_DEFAULTS = (
    ("caseLevel", False),
    ("caseFirst", "off"),
    ("strength", 3),
    ("numericOrdering", False),
    ("alternate", "non-ignorable"),
    ("maxVariable", "punct"),
    ("normalization", False),
    ("backwards", False),
    ("version", "57.1"),
)
_ROOT_DEFAULT_LOCALES = frozenset(
    {"en", "en_US", "en_GB", "fr", "de", "es", "it", "pt", "nl", "ru", "pl", "ja", "ko", "zh"}
)


def expand_collation(collation: dict[str, Any]) -> dict[str, Any] | None:
    """The full collation spec the server stores for `collation`; None for the simple collation
    (no collation at all); a locale this module has no defaults for comes back as given."""
    locale = collation.get("locale")
    if locale == "simple":
        return None
    if locale not in _ROOT_DEFAULT_LOCALES:
        return dict(collation)
    return {
        "locale": locale,
        **{k: collation.get(k, default) for k, default in _COLLATION_DEFAULTS},
    }


def _int_or_long(value: Any) -> Any:
    """BSONObjBuilder::appendNumber(long long): an int32 when it fits in 31 bits, else an int64."""
    n = int(value)
    return n if -(1 << 30) <= n <= (1 << 30) else Int64(n)


def catalog_options(options: dict[str, Any]) -> dict[str, Any]:
    """A create command's options (without `create` and `idIndex`) as the catalog stores them."""
    given = dict(options)
    out = _capped_options(given)
    for name in ("capped", "size", "max"):
        given.pop(name, None)
    if "collation" in given:
        _expand_collation_in(given)
    if isinstance(given.get("clusteredIndex"), dict):
        given["clusteredIndex"] = _clustered_index(given["clusteredIndex"])
    if "expireAfterSeconds" in given:
        given["expireAfterSeconds"] = Int64(given["expireAfterSeconds"])
    for name in _ORDER:
        if name in given:
            out[name] = given.pop(name)
    out.update(given)
    return out


def _expand_collation_in(given: dict[str, Any]) -> None:
    """The collation with every field the server fills in (none for the simple collation)."""
    collation = expand_collation(dict(given.pop("collation")))
    if collation is not None:
        given["collation"] = collation


def _capped_options(given: dict[str, Any]) -> dict[str, Any]:
    """A capped collection's capped, size and max as the catalog stores them ({} if uncapped)."""
    if not given.get("capped"):
        return {}
    # adjustCappedSize: rounded up to a multiple of 256 bytes.
    out = {"capped": True, "size": _int_or_long((int(given.get("size") or 0) + 0xFF) & ~0xFF)}
    if given.get("max"):
        out["max"] = _int_or_long(given["max"])
    return out


def _clustered_index(spec: dict[str, Any]) -> dict[str, Any]:
    """ClusteredIndexSpec's IDL order: v, key, name, unique (`clusteredIndex: true`, the
    time-series buckets' form, stays a bool)."""
    return {
        "v": spec.get("v", 2),
        "key": spec["key"],
        **({"name": spec["name"]} if "name" in spec else {}),
        "unique": spec.get("unique", True),
    }


def create_entry_o(
    name: str, options: dict[str, Any], id_index: dict[str, Any] | None
) -> dict[str, Any]:
    """The `o` of a create entry: the stored options, then the _id index spec (v >= 2 only; none
    for a clustered collection, which has no separate _id index)."""
    o = {"create": name, **options}
    if "clusteredIndex" in options:
        return o
    spec: dict[str, Any] = (
        {"v": 2, "key": {"_id": 1}, "name": "_id_"} if id_index is None else dict(id_index)
    )
    if int(spec.get("v", 2)) < 2:
        return o
    # The _id index is always named _id_ and inherits the collection's default collation.
    spec = {"v": int(spec.get("v", 2)), "key": {"_id": 1}, "name": "_id_"}
    if "collation" in options:
        spec["collation"] = options["collation"]
    o["idIndex"] = spec
    return o


def options_before_change(uuid: Any, options: dict[str, Any]) -> dict[str, Any]:
    """collMod's o2 `collectionOptions_old`: the collection's options with its uuid first, as
    CollectionOptions::appendBSON writes them (jstests/change_streams/ddl_coll_mod_event.js)."""
    return {"uuid": uuid, **catalog_order(options)}


def catalog_order(options: dict[str, Any]) -> dict[str, Any]:
    out = {name: options[name] for name in _ORDER if name in options}
    out.update({k: v for k, v in options.items() if k not in out})
    return out


def text_index_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A text index's spec as the catalog keeps it (fts_spec.cpp, FTSSpec::fixSpec): the text
    fields of the key become `_fts: "text", _ftsx: 1` where the first of them stood, each gets a
    weight (1 unless `weights` gives one), and default_language, language_override and
    textIndexVersion follow the other options with their defaults ("english", "language", 3)
    (jstests/change_streams/ddl_create_drop_index_events.js expects that key in the events)."""
    key = spec["key"]
    if "_fts" in key or "text" not in key.values():
        return spec
    fixed_key, weights = _text_key(key, dict(spec.get("weights") or {}))
    tail = ("weights", "default_language", "language_override", "textIndexVersion")
    out = {k: (fixed_key if k == "key" else v) for k, v in spec.items() if k not in tail}
    out["weights"] = weights
    out["default_language"] = spec.get("default_language", "english")
    out["language_override"] = spec.get("language_override", "language")
    out["textIndexVersion"] = spec.get("textIndexVersion", 3)
    return out


def _text_key(
    key: dict[str, object], weights: dict[str, object]
) -> tuple[dict[str, object], dict[str, object]]:
    """(the key with its text fields made `_fts: "text", _ftsx: 1` where the first stood, the
    weights with 1 for each text field that had none)."""
    fixed_key: dict[str, Any] = {}
    for field, kind in key.items():
        if kind != "text":
            fixed_key[field] = kind
            continue
        weights.setdefault(field, 1)
        fixed_key.setdefault("_fts", "text")
        fixed_key.setdefault("_ftsx", 1)
    return fixed_key, weights


def fix_index_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """An index spec as the catalog keeps it: v, unique, hidden, prepareUnique (each only when
    true), key, name, then the rest in the order given; a text index's key and options as
    `text_index_spec` gives them."""
    spec = text_index_spec(spec)
    out: dict[str, Any] = {"v": int(spec.get("v", 2))}
    for flag in ("unique", "hidden", "prepareUnique"):
        if spec.get(flag):
            out[flag] = True
    out["key"] = spec["key"]
    out["name"] = spec["name"]
    out.update(
        {
            k: v
            for k, v in spec.items()
            if k not in ("v", "unique", "hidden", "prepareUnique", "key", "name", "ns")
        }
    )
    return out


def index_name(key: dict[str, Any]) -> str:
    """The default name of an index on `key` (the shell's and drivers' rule, which the server's
    shard key index follows: field_value pairs joined by underscores)."""
    return "_".join(f"{field}_{value}" for field, value in key.items())


def view_document(options: dict[str, Any]) -> dict[str, Any]:
    """A view's system.views document after its `_id` (ViewDefinition): viewOn, pipeline and the
    view's default collation when it has one."""
    doc = {"viewOn": options["viewOn"], "pipeline": list(options.get("pipeline", []))}
    if "collation" in options:
        doc["collation"] = options["collation"]
    return doc


def modified_index_spec(spec: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """An index spec after collMod's `index` options (CollectionImpl::updateHiddenSetting and its
    siblings: `hidden: false` removes the field, as the catalog keeps only true flags)."""
    out = dict(spec)
    for name, value in changes.items():
        if name in ("name", "keyPattern"):
            continue
        out[name] = value
    return fix_index_spec(out)

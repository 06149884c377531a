"""jstests/change_streams/error_label.js: a pipeline that projects out the resume token (`_id`)
fails with ChangeStreamFatalError (280) at the first event. (The jstest also checks the
NonResumableChangeStreamError label, which the case model does not compare.)"""

from tests.conformance.model import Case

SOURCE = "jstests/change_streams/error_label.js"
COLL = "change_stream_error_label"

CASES = [
    Case(
        "error-label-projected-out-resume-token",
        SOURCE,
        "collection",
        coll=COLL,
        setup=(("command", {"create": COLL}),),
        pipeline=({"$project": {"_id": 0}},),
        ops=(("insert", COLL, {"a": 1}),),
        error=280,
    )
]

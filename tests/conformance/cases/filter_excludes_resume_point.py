"""jstests/change_streams/filter_excludes_resume_point.js: resuming with a pipeline whose $match
filters out the resume point's own event fails with ChangeStreamFatalError (280), as long as
SERVER-71565 stands (the 8.0-era version of the jstest, an ES module). The jstest also projects
out `_id`, which a driver's watch() refuses on its own; the server's error comes first either
way."""

from tests.conformance.model import Case

SOURCE = "jstests/change_streams/filter_excludes_resume_point.js"
COLL = "filter_excludes_resume_point"

CASES = [
    Case(
        "filter-excludes-resume-point",
        SOURCE,
        "collection",
        coll=COLL,
        setup=(("command", {"create": COLL}),),
        ops=(("insert_many", COLL, [{"_id": 1}, {"_id": 2}]),),
        resume=("resumeAfter", 0),
        resume_pipeline=({"$match": {"fullDocument._id": {"$gt": 1}}},),
        error=280,
    )
]

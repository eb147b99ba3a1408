"""Test helper: rewrites a checkpoint's metadata.json in place.
  edit_checkpoint.py STEPDIR half-box-twice   the first tensor's box covers its first half of
                                              dimension 0, twice (the second half uncovered)
  edit_checkpoint.py STEPDIR files-key NAME   'files' also lists NAME (with some digest)"""
import json
import os
import sys

step_dir, what = sys.argv[1:3]
path = os.path.join(step_dir, "metadata.json")
meta = json.load(open(path))
if what == "half-box-twice":
    box = meta["boxes"][0]
    box["shape"][0] //= 2
    meta["boxes"].insert(1, dict(box))
elif what == "files-key":
    meta["files"][sys.argv[3]] = "0000000000000000"
else:
    sys.exit(f"unknown edit {what!r}")
json.dump(meta, open(path, "w"))

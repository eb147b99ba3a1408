"""sentencepiece.test: ptc-tokenize's ids are Python sentencepiece's, document by document."""
import json
import sys

import numpy as np
import sentencepiece as spm

model, tokens, inputs = sys.argv[1], sys.argv[2], sys.argv[3:]
sp = spm.SentencePieceProcessor(model_file=model)
expected = []
for path in inputs:
    if path.endswith(".jsonl"):
        for line in open(path, encoding="utf-8"):
            if line.strip():
                expected += sp.encode(json.loads(line)["text"])
    else:
        expected += sp.encode(open(path, encoding="utf-8").read())
mine = np.fromfile(tokens, dtype="<u2")
assert len(mine) == len(expected), (len(mine), len(expected))
assert (mine == np.array(expected)).all(), "ids differ"
print(f"{len(mine)} ids equal Python sentencepiece's")

"""report-memory.test: the 7.5B GPT of the ZeRO paper on dp=64 in fp32, stages 0 to 3.
Each stage's predicted peak holds at least the paper's model states for that stage
(params + gradients + AdamW state, 4 + 4 + 8 bytes a parameter) plus the communication
buffer, and at most 10% more than that plus the plan's saved activations (the
activations die as the backward pass runs while the gradients appear; the arena's other
temporaries); stage 3 adds two layers' gathered weights. The stages are distinct: each one's peak below the previous one's.

  zero_stages.py Z0 Z1 Z2 Z3"""
import re
import sys

H, DP = 4096, 64


def field(text, name):
    return int(re.search(r"^  %s +([0-9]+) B" % re.escape(name), text, re.M).group(1))


texts = [open(f).read() for f in sys.argv[1:5]]
psi = int(re.search(r"x ([0-9]+) parameters, dp=", texts[0]).group(1))
layer = 12 * H * H + 13 * H
states = [16 * psi, (8 + 8 / DP) * psi, (4 + 12 / DP) * psi, 16 * psi / DP + 2 * 4 * layer]
names = ["zero=0: 16 psi", "zero=1: (4 + 4 + 8/dp) psi, gradients whole",
         "zero=2: (4 + 12/dp) psi, gradients reduce-scattered", "zero=3: 16 psi/dp + two layers"]
ok = True
peaks = []
for name, text, s in zip(names, texts, states):
    peak, comm, acts = field(text, "predicted peak"), field(text, "communication"), field(text, "saved activations")
    peaks.append(peak)
    good = s + comm <= peak <= 1.1 * (s + acts + comm)
    ok &= good
    print(f"{name}: peak {peak / 1e9:.2f} GB, model states {s / 1e9:.2f} GB + communication "
          f"{comm / 1e9:.2f} GB (+ activations {acts / 1e9:.2f} GB, 10%): {'ok' if good else 'NO'}")
distinct = all(a > b for a, b in zip(peaks, peaks[1:]))
print("each stage below the previous one" if distinct else f"stages not distinct: {peaks}")
sys.exit(0 if ok and distinct else 1)

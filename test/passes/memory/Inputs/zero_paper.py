"""Compares the predicted peaks of ptc-report-memory outputs (the 7.5B GPT on dp=64,
bf16, ZeRO-2, ZeRO-3, then optionally ZeRO-1) with the ZeRO paper's model states plus the
plan's own activations and communication buffer; prints one line per check."""
import re
import sys

H, LAYERS, DP = 4096, 36, 64


def field(text, name):
    return int(re.search(r"^  %s +([0-9]+) B" % re.escape(name), text, re.M).group(1))


z1, z3 = (open(f).read() for f in sys.argv[1:3])
s1 = open(sys.argv[3]).read() if len(sys.argv) > 3 else None
psi = int(re.search(r"x ([0-9]+) parameters, dp=", z1).group(1))
gathered = int(re.search(r"of which ([0-9]+) B are gathered", z1).group(1))
acts1 = field(z1, "saved activations") - gathered
layer = 12 * H * H + 13 * H  # one transformer layer's parameters
for name, text, states in (
        ("zero=2 within 10% of (2 + 16/dp) psi + activations + communication", z1,
         (2 + 16 / DP) * psi + acts1),
        ("zero=3 within 10% of 16 psi/dp + two layers + activations + communication", z3,
         16 * psi / DP + 2 * 2 * layer + field(z3, "saved activations"))):
    expected = states + field(text, "communication")
    peak = field(text, "predicted peak")
    ok = abs(peak - expected) <= 0.1 * expected
    print(name if ok else f"{name}: NO, {peak} B against {expected:.0f} B")
if s1 is not None:
    # ZeRO-1: the bf16 gradients whole (2 psi), the working copies gathered per
    # layer and freed after their backward use, so copies and gradients take
    # turns: the peak is ZeRO-2's, 2 psi below the paper's (4 + 12/dp) psi.
    peak = field(s1, "predicted peak")
    ours = (2 + 16 / DP) * psi + acts1 + field(s1, "communication")
    paper = (4 + 12 / DP) * psi + acts1 + field(s1, "communication")
    ok = abs(peak - ours) <= 0.1 * ours and peak < paper
    print(f"zero=1 within 10% of (2 + 16/dp) psi + activations + communication, "
          f"{paper / peak:.2f}x below the paper's (4 + 12/dp) psi + activations + communication"
          if ok else f"zero=1: NO, {peak} B against {ours:.0f} B (paper {paper:.0f} B)")
saved3 = field(z3, "saved activations")
print("zero=3 saves no more activations than it would without gathered weights"
      if saved3 == acts1 else f"zero=3 saves {saved3} B, zero=1 without gathered {acts1} B")

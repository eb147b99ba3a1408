"""Checks the memory report's saved activations against Korthikanti et al.'s per-layer
formula: for each layout, the report of an (L+1)-layer GPT minus that of an L-layer GPT
must be exactly the per-layer bytes the report derives from the formula, plus the layer's
attention softmax statistics (ptc-save-attention-stats; outside the formula, reported
beside it).

usage: layer_activations.py PTC_OPT WORKDIR"""
import re
import subprocess
import sys

opt, work = sys.argv[1], sys.argv[2]
layouts = ["", "mesh=tp:2", "mesh=tp:4", "mesh=tp:2 sequence-parallel=true", "precision=bf16",
           "mesh=dp:2", "mesh=dp:2,tp:2 precision=bf16"]
ok = True
for layout in layouts:
    saved, stats, per_layer = [], [], None
    for layers in (2, 3):
        out = subprocess.run([opt, f"{work}/gpt{layers}.mlir",
                              f"--ptc-compile=plan={work}/x.plan report-memory=true {layout}",
                              "-o", "/dev/null"], check=True, capture_output=True, text=True).stdout
        saved.append(int(re.search(r"saved activations\s+(\d+) B", out).group(1)))
        st = re.search(r"attention's softmax statistics \((\d+) B\)", out)
        stats.append(int(st.group(1)) if st else 0)
        m = re.search(r"= (\d+) B(?: \+ (\d+) B of all-gathered[^;]*)?; x \d+ layers", out)
        per_layer = int(m.group(1)) + int(m.group(2) or 0)
    layer_stats = stats[1] - stats[0]
    good = saved[1] - saved[0] == per_layer + layer_stats
    ok &= good
    print(f"{layout or 'one device':34s} one layer saves {saved[1] - saved[0]} B, formula {per_layer} B"
          f" + statistics {layer_stats} B: {'ok' if good else 'MISMATCH'}")
sys.exit(0 if ok else 1)

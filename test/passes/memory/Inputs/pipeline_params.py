"""report-memory.test: each pipeline rank's parameter bytes (the per-rank table of
ptc-report-memory) against the closed form of a GPT split evenly over pp and tp:
4 bytes x (layers/pp x 12 h^2 / tp), plus on rank 0 the vocabulary-parallel token
embedding (V h / tp) and the position embedding (S h).

  pipeline_params.py REPORT LAYERS H V S PP TP"""
import re
import sys

report = open(sys.argv[1]).read()
layers, h, v, s, pp, tp = (int(x) for x in sys.argv[2:8])
rows = re.findall(r"^  ([0-9]+) +([0-9]+) ", report, re.M)
assert len(rows) == pp, rows
ok = True
for rank, params in rows:
    rank, params = int(rank), int(params)
    closed = 4 * (layers / pp) * 12 * h * h / tp
    if rank == 0:
        closed += 4 * (v * h / tp + s * h)
    good = abs(params - closed) <= 0.12 * closed
    ok &= good
    print(f"pipeline rank {rank}: {params / 1e9:.2f} GB of parameters, closed form "
          f"{closed / 1e9:.2f} GB: {'within 12%' if good else 'NOT within 12%'}")
sys.exit(0 if ok else 1)

"""train.test: the job's CSV and TensorBoard files after STEPS steps."""
import csv
import glob
import subprocess
import sys

run, steps, reader = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = list(csv.DictReader(open(run + "/metrics.csv")))
assert [int(r["step"]) for r in rows] == list(range(1, steps + 1))
for r in rows:
    for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
        assert r[key] and float(r[key]) > 0, (r["step"], key, r[key])
lrs = [float(r["lr"]) for r in rows]
assert max(lrs) == lrs[5] and 1e-3 <= lrs[-1] < 1.05e-3, "5 warmup steps, then cosine to min_lr"
first = sum(float(r["loss"]) for r in rows[:5]) / 5
last = sum(float(r["loss"]) for r in rows[-5:]) / 5
print(f"loss {first:.3f} -> {last:.3f}")
assert last < first - 0.5, (first, last)
events = glob.glob(run + "/tensorboard/events.out.tfevents.*")
assert len(events) == 1, events
out = subprocess.run([sys.executable, reader, events[0]], check=True, capture_output=True, text=True).stdout
loss = {int(s): float(v) for s, tag, v in (l.split() for l in out.splitlines()) if tag == "train/loss"}
assert sorted(loss) == list(range(1, steps + 1))
assert all(abs(loss[int(r["step"])] - float(r["loss"])) < 1e-5 * float(r["loss"]) for r in rows)
evals = [s for s, tag, v in (l.split() for l in out.splitlines()) if tag == "eval/loss"]
assert evals == ["20", "40"], evals

"""metrics-files.test: the CSV, JSON lines and TensorBoard files agree."""
import csv
import glob
import json
import subprocess
import sys

csv_path, jsonl_path, tb_dir, reader = sys.argv[1:5]
rows = list(csv.DictReader(open(csv_path)))
assert [int(r["step"]) for r in rows] == list(range(1, 13)), [r["step"] for r in rows]
for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "tflops_per_device", "mfu", "eval_loss"):
    assert key in rows[0], key
assert all(r["lr"] and r["grad_norm"] and r["tokens_per_s"] and r["mfu"] for r in rows)
assert [int(r["step"]) for r in rows if r["eval_loss"]] == [4, 8], "eval after steps 4 and 8"
lines = [json.loads(x) for x in open(jsonl_path)]
assert [l["step"] for l in lines] == list(range(1, 9))
for l, r in zip(lines, rows):
    for key in ("loss", "lr", "grad_norm"):
        assert abs(l[key] - float(r[key])) <= 1e-6 * abs(l[key]), (key, l[key], r[key])
files = sorted(glob.glob(tb_dir + "/events.out.tfevents.*"))
assert len(files) == 2, files  # the first run's and the resumed run's
scalars = {}
for f in files:
    out = subprocess.run([sys.executable, reader, f], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        step, tag, value = line.split()
        scalars[(int(step), tag)] = float(value)
for r in rows:
    step = int(r["step"])
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
        v = scalars[(step, "train/" + key)]
        assert abs(v - float(r[key])) <= 1e-6 * abs(v), (step, key, v, r[key])
    if r["eval_loss"]:
        assert abs(scalars[(step, "eval/loss")] - float(r["eval_loss"])) < 1e-6
first = sum(float(r["loss"]) for r in rows[:3]) / 3
last = sum(float(r["loss"]) for r in rows[-3:]) / 3
assert last < first, (first, last)
print("metrics files agree:", len(rows), "steps,", len(scalars), "TensorBoard scalars")

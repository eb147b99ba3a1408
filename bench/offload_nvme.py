#!/usr/bin/python3
"""Benchmark: NVMe offload (ptc-run --offload-dir) against offload to host memory, on one
process, same plan, measured together: median step time and the ratio, the offload file's
size against the most of it resident in host memory (mincore after each use), the
process peak RSS of both runs, and the NVMe run's peak RSS less the device's own allocation
(host memory on the discrete CPU device) and less ptc-run's own resident libraries against the
optimizer state. The model: a GPT of 8 layers, hidden 768 (57M parameters:
fp32 master weights and AdamW state 690 MB), offload=optimizer on the CPU presented as a
discrete device (--device cpu-discrete), so the device's own memory counts in the RSS too.

usage: bench/offload_nvme.py [--bin build/bin] [--dir DIR (default: a folder under /tmp)]
                             [--steps 8] [--layers 8] [--hidden 768]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(here, "..", "build", "bin"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=768)
    a = ap.parse_args()
    b = lambda t: os.path.join(a.bin, t)
    with tempfile.TemporaryDirectory() as work:
        w = lambda f: os.path.join(work, f)
        nvme = a.dir or w("nvme")
        os.makedirs(nvme, exist_ok=True)
        subprocess.run([b("ptc-tokenize"), "-o", w("data.bin"), "/usr/share/common-licenses/GPL-3"],
                       check=True, capture_output=True)
        subprocess.run([b("ptc-model"), "gpt", "--layers", str(a.layers), "--hidden", str(a.hidden),
                        "--heads", "12", "--seq", "64", "--vocab", "256", "--batch", "4", "-o",
                        w("gpt.mlir")], check=True)
        subprocess.run([b("ptc-opt"), w("gpt.mlir"), f"--ptc-compile=plan={w('gpt.plan')} offload=optimizer",
                        "-o", os.devnull], check=True)
        results = {}
        # The timed runs without --memory-report (its residency measurement is
        # a pass over the file's pages after each use); one short run with it.
        for name, extra in (("host memory", []), ("NVMe file", ["--offload-dir", nvme]),
                            ("residency", ["--offload-dir", nvme, "--memory-report"])):
            steps = 2 if name == "residency" else a.steps
            cmd = ["/usr/bin/time", "-f", "maxrss %M", b("ptc-run"), w("gpt.plan"), "--device",
                   "cpu-discrete", "--data", w("data.bin"), "--steps", str(steps), "--log-every", "0",
                   "--metrics", w("m.jsonl"), "--peak-tflops", "1", *extra]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stdout[-2000:], r.stderr[-2000:])
                return 1
            out = r.stdout + r.stderr
            if name == "residency":
                results[name] = (0, 0, [], out)
                continue
            rows = [json.loads(l) for l in open(w("m.jsonl"))]
            # Step time: the elapsed between steps, the first step (warm-up) left out.
            times = [rows[i]["elapsed_s"] - rows[i - 1]["elapsed_s"] for i in range(2, len(rows))]
            results[name] = (statistics.median(times), int(re.search(r"maxrss (\d+)", out).group(1)),
                             [x["loss"] for x in rows], out)
        params = int(re.search(r"([0-9]+) parameters", results["host memory"][3]).group(1))
        report = results.pop("residency")[3]
        m = re.search(r"offload file (\d+) B .*at most (\d+) B of it resident", report)
        file_bytes, resident = int(m.group(1)), int(m.group(2))
        # On cpu-discrete the device's own memory (the plan's device tensors and
        # arena) is host memory too and counts in the RSS.
        device = int(re.search(r"memory \(rank 0\): allocated (\d+) B", report).group(1))
        print(f"model: GPT, {a.layers} layers, hidden {a.hidden}: {params} parameters; "
              f"offload file {file_bytes / 1e6:.0f} MB (fp32 master weights + AdamW), "
              f"optimizer state {8 * params / 1e6:.0f} MB")
        for name, (t, rss, _, _) in results.items():
            print(f"  {name:12s} step {t * 1e3:8.1f} ms  process peak RSS {rss * 1024 / 1e6:7.0f} MB")
        th, tn = results["host memory"][0], results["NVMe file"][0]
        print(f"  NVMe / host step time: {tn / th:.2f}x; at most {resident / 1e6:.0f} MB of the "
              f"{file_bytes / 1e6:.0f} MB file resident ({resident / file_bytes:.0%}), "
              f"{resident / (8 * params):.0%} of the optimizer state")
        # The process before any plan: ptc-run's libraries' resident pages (a CUDA
        # build maps cuBLAS and the CUDA runtime even on CPU devices).
        r = subprocess.run(["/usr/bin/time", "-f", "maxrss %M", b("ptc-run"), "--help"],
                           capture_output=True, text=True)
        baseline = int(re.search(r"maxrss (\d+)", r.stdout + r.stderr).group(1)) * 1024
        host_side = results["NVMe file"][1] * 1024 - device - baseline
        print(f"  NVMe run: peak RSS {results['NVMe file'][1] * 1024 / 1e6:.0f} MB = the device's "
              f"allocation {device / 1e6:.0f} MB (host memory on cpu-discrete) + ptc-run's own "
              f"{baseline / 1e6:.0f} MB (`ptc-run --help`) + {host_side / 1e6:.0f} MB for the run: "
              f"{host_side / (8 * params):.0%} of the optimizer state "
              f"({'below' if host_side < 8 * params else 'NOT below'} it)")
        same = results["host memory"][2] == results["NVMe file"][2]
        print(f"  losses bitwise equal: {'yes' if same else 'NO'}")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

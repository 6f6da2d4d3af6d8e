"""flashcute against SDPA's cuDNN backend at one point, d 128 without a mask at 16k (b 1, h 16), timed
three ways on one GPU: 300 back-to-back calls of one implementation (about 1 s of sustained load:
clocks settle at what the power limit allows), twice each in turn, then the two interleaved call
by call; the SM clock and power sampled every 50 ms by nvidia-smi over each phase (docs/perf-notes.md,
benchmark method: why in-turns timing reads higher than sustained load).

Its timing is its own, said in its first output line: the bench's timer (flashcute.bench.timing.time_calls,
CUDA events around each call) after 10 warm-up calls of each at the start, with no warm-up within a
phase and no L2 flush (q, k, v and out take 256 MiB, beyond any L2), so that the clocks' drift under
load shows; its numbers are not the bench's standard timing and are not to be quoted as such.

    python3 scripts/sustained_fwd.py [bf16|fp16]

Needs torch with CUDA, cuDNN's SDPA backend, and flashcute built with head dim 128.
"""
import statistics, subprocess, time, sys
import torch, flashcute
from flashcute.bench.arrays import TorchLib
from flashcute.bench.timing import time_calls
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

b, s, h, d = 1, 16384, 16, 128
dt = torch.bfloat16 if (len(sys.argv) < 2 or sys.argv[1] == "bf16") else torch.float16
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dt) for _ in range(3))
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
flops = 4 * b * h * s * s * d
fc = lambda: flashcute.flash_attn_func(q, k, v)
def cud():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt)
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
clock = TorchLib(torch)
def timed(fn, n):  # n back-to-back calls, each between its own events (the bench's timer)
    return time_calls(clock, [fn], 0, n)
phases = []
for fn in (fc, cud):
    for _ in range(10): fn()
torch.cuda.synchronize()
time.sleep(1.0)
for name, fn in (("fc", fc), ("cudnn", cud), ("fc", fc), ("cudnn", cud)):
    t0 = time.time(); ts = timed(fn, 300); t1 = time.time()
    phases.append((f"sustained {name}", t0, t1, {name: ts}))
    time.sleep(1.0)
t0 = time.time(); a, c = [], []
for _ in range(300):
    a += timed(fc, 1); c += timed(cud, 1)
t1 = time.time()
phases.append(("interleaved", t0, t1, {"fc": a, "cudnn": c}))
smi.terminate(); out = smi.communicate()[0]
samples = []
for line in out.splitlines():
    try:
        tsx, clk, pw = [x.strip() for x in line.split(",")]
        tt = time.mktime(time.strptime(tsx.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + tsx.split(".")[1])
        samples.append((tt, float(clk), float(pw)))
    except Exception:
        pass
print("timing: sustained_fwd (CUDA events around each call, no warm-up inside a phase, no L2 flush: 256 MiB of "
      "q, k, v and out); not flashcute.bench's standard timing")
print(dt, "TFLOP/s medians (first 50 calls / last 200 calls / all), mean SM MHz and W over the phase")
for label, t0, t1, res in phases:
    sm = [x for x in samples if t0 <= x[0] <= t1]
    clk = statistics.mean(x[1] for x in sm) if sm else float("nan")
    pw = statistics.mean(x[2] for x in sm) if sm else float("nan")
    for name, ts in res.items():
        tf = lambda xs: flops / (statistics.median(xs) * 1e-3) / 1e12
        print(f"{label:16s} {name:6s} {tf(ts[:50]):6.1f} / {tf(ts[-200:]):6.1f} / {tf(ts):6.1f}   {clk:6.0f} MHz {pw:5.0f} W  ({len(sm)} samples)")

#!/usr/bin/env python3
"""gearsim against SCALE-Sim 3.0.0 on ResNet-18, side by side in one run on this machine.

SCALE-Sim (pip install scalesim==3.0.0 with numpy < 2, into a virtual environment this script
makes) simulates ResNet-18's 20 convolution layers at batch 1 on a 128x128 weight-stationary
systolic array with its default SRAM sizes and `InterfaceBandwidth: CALC`; gearsim simulates
the whole torchvision ResNet-18 at batch 1 (every layer, every core, HBM, the runtime's copies)
with `gearsim run`, process start and model load included, timing-only and with values. The script prints each wall
time and the ratios. The layer shapes are public facts (He et al. 2016, torchvision's
resnet18); the topology file is written here, each input padded as the layer pads it.

It takes minutes (SCALE-Sim alone about four on two cores), so it is not part of the test
suite. Usage, from the workspace root:

    python3 tests/scalesim/compare.py [--work /tmp/scalesim] [--repeat 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, input size before padding, kernel, in channels, out channels, stride)
LAYERS = [("conv1", 224, 7, 3, 64, 2)]
for stage, (c_in, c, hw) in enumerate([(64, 64, 56), (64, 128, 56), (128, 256, 28), (256, 512, 14)]):
    for block in range(2):
        first = block == 0
        stride = 2 if first and stage > 0 else 1
        src = c_in if first else c
        in_hw = hw if first else hw // (2 if stage > 0 else 1)
        p = f"layer{stage + 1}.{block}"
        LAYERS.append((f"{p}.conv1", in_hw, 3, src, c, stride))
        out_hw = in_hw // stride
        LAYERS.append((f"{p}.conv2", out_hw, 3, c, c, 1))
        if first and stage > 0:
            LAYERS.append((f"{p}.downsample", in_hw, 1, src, c, stride))
assert len(LAYERS) == 20, len(LAYERS)

CONFIG = """[general]
run_name = resnet18_b1

[architecture_presets]
ArrayHeight:    128
ArrayWidth:     128
ifmapsramszkB:    256
filtersramszkB:   256
ofmapsramszkB:    128
IfmapOffset:    0
FilterOffset:   10000000
OfmapOffset:    20000000
Dataflow : ws
Bandwidth : 10
ReadRequestBuffer: 60
WriteRequestBuffer: 60

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: CALC
UseRamulatorTrace: False
"""


def topology():
    """SCALE-Sim's conv topology: the input as the layer sees it, padding included."""
    rows = ["Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, "
            "Num Filter, Strides,"]
    for name, hw, k, c_in, c_out, stride in LAYERS:
        padded = hw + 2 * (k // 2)
        # An even padded size with an odd kernel at stride 2 leaves one row unused (as the
        # convolution does); SCALE-Sim then gives the same output size.
        rows.append(f"{name}, {padded}, {padded}, {k}, {k}, {c_in}, {c_out}, {stride},")
    return "\n".join(rows) + "\n"


def layout():
    """SCALE-Sim 3's layout file (read even when no custom layout is used): the identity."""
    rows = ["Layer name, IFMAP Height Intraline Factor, IFMAP Width Intraline Factor, "
            "Filter Height Intraline Factor, Filter Width Intraline Factor, "
            "Channel Intraline Factor, Num Filter Intraline Factor, "
            "IFMAP Height Intraline Order, IFMAP Width Intraline Order, "
            "Channel Intraline Order, IFMAP Height Interline Order, "
            "IFMAP Width Interline Order, Channel Interline Order, "
            "Num Filter Intraline Order, Channel Intraline Order, "
            "Filter Height Intraline Order, Filter Width Intraline Order, "
            "Num Filter Interline Order, Channel Interline Order, "
            "Filter Height Interline Order, Filter Width Interline Order,"]
    identity = [1] * 6 + [0, 1, 2] * 2 + [0, 1, 2, 3] * 2
    for name, *_ in LAYERS:
        rows.append(name + ", " + ", ".join(map(str, identity)) + ",")
    return "\n".join(rows) + "\n"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def timed(cmd, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run(cmd)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/gearsim-scalesim")
    ap.add_argument("--repeat", type=int, default=3, help="gearsim runs per mode (median)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    venv = os.path.join(a.work, "venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        run([sys.executable, "-m", "venv", venv])
    # SCALE-Sim 3.0.0 converts one-element arrays to int, which numpy 2 refuses.
    run([py, "-m", "pip", "install", "-q", "scalesim==3.0.0", "numpy<2"])
    version = run([py, "-c", "import importlib.metadata as m; print(m.version('scalesim'))"])
    run(["cargo", "build", "-q", "--release", "-p", "gearsim-host", "--bin", "gearsim"], cwd=ROOT)
    gearsim = os.path.join(ROOT, "target", "release", "gearsim")

    topo = os.path.join(a.work, "resnet18_b1.csv")
    cfg = os.path.join(a.work, "scale.cfg")
    lay = os.path.join(a.work, "resnet18_b1_layout.csv")
    with open(topo, "w") as f:
        f.write(topology())
    with open(lay, "w") as f:
        f.write(layout())
    with open(cfg, "w") as f:
        f.write(CONFIG)
    script = ("import sys; from scalesim.scale_sim import scalesim\n"
              "s = scalesim(save_disk_space=True, verbose=False, config=sys.argv[1], "
              "topology=sys.argv[2], layout=sys.argv[4], input_type_gemm=False)\n"
              "s.run_scale(top_path=sys.argv[3])\n")
    t = time.perf_counter()
    run([py, "-c", script, cfg, topo, os.path.join(a.work, "results"), lay], cwd=a.work)
    scalesim_s = time.perf_counter() - t
    report = os.path.join(a.work, "results", "resnet18_b1", "COMPUTE_REPORT.csv")
    cycles = 0
    if os.path.exists(report):
        with open(report) as f:
            next(f)
            cycles = sum(int(float(line.split(",")[1])) for line in f if line.strip())

    onnx = os.path.join(a.work, "resnet18_b1.onnx")
    om = os.path.join(a.work, "resnet18_b1")
    run([gearsim, "model", "--net", "resnet18", "--batch", "1", "--output", onnx])
    run([gearsim, "compile", "--model", onnx, "--output", om, "--soc_version", "ascend910"])
    out = os.path.join(a.work, "out")
    base = [gearsim, "run", "--model", om + ".om", "--output_dir", out]
    timing_s = timed(base + ["--timing_only"], a.repeat)
    full_s = timed(base, a.repeat)

    print(f"SCALE-Sim {version.stdout.strip()}, 20 conv layers of ResNet-18 at batch 1 "
          f"(128x128 ws array): {scalesim_s:.1f} s" + (f", {cycles} cycles" if cycles else ""))
    print(f"gearsim, whole ResNet-18 at batch 1 on ascend910, `gearsim run` (start and load "
          f"included, median of {a.repeat}): timing-only {timing_s:.3f} s, with values "
          f"{full_s:.3f} s")
    print(f"ratio: timing-only {scalesim_s / timing_s:.0f}x, with values "
          f"{scalesim_s / full_s:.0f}x faster than SCALE-Sim")


if __name__ == "__main__":
    main()

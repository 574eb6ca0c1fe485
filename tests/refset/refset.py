#!/usr/bin/env python3
"""The before/after reference set: files a refactoring must leave byte-identical.

Builds, with a given `gearsim` binary and nothing but the Python standard library, every file
of the reference set into a work folder and prints (or checks) their SHA-256 hashes:

- the demo's trace (`gearsim demo --trace`);
- the demo's models and the test models (CNN, transformer, the three gear goldens and the
  PyTorch-exported residual CNN at two gears) compiled non-sink and GetNext-sink, every gear run
  in both modes on seeded inputs: the `.om` files, every output `.npy` and every `.gtrace`;
- every example kernel: its assembled `.bin`, and a traced run with its buffers saved.

Usage, from the workspace root:

    cargo build --release -p gearsim-host --bin gearsim
    python3 tests/refset/refset.py --gearsim target/release/gearsim --work /tmp/refset \
        --check tests/refset/before.sha256

`--write FILE` records the hashes instead (done once, on the commit before a refactoring).
A check prints every file whose hash differs, is missing or is new, and exits 1 if any does.
"""

import argparse
import hashlib
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "tests", "models")


class Lcg:
    """A 64-bit linear congruential generator: the same numbers on every host."""

    def __init__(self, seed):
        self.state = (seed * 6364136223846793005 + 1442695040888963407) % 2**64

    def next_unit(self):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2**64
        return (self.state >> 11) / float(1 << 53)


def write_npy(path, dtype, shape, seed):
    """Writes a little-endian .npy of `shape` with seeded values (f32 in [-1, 1), i32 in [0, 8))."""
    rng = Lcg(seed)
    count = 1
    for d in shape:
        count *= d
    if dtype == "f32":
        descr, body = "<f4", b"".join(
            struct.pack("<f", rng.next_unit() * 2.0 - 1.0) for _ in range(count)
        )
    elif dtype == "i32":
        descr, body = "<i4", b"".join(
            struct.pack("<i", int(rng.next_unit() * 8)) for _ in range(count)
        )
    else:
        raise ValueError(dtype)
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(body)


# Each model: ONNX file, --input_shape, gear option and value, and per gear the inputs
# (name, dtype, shape) in model-input order.
MODEL_CASES = [
    {
        "name": "cnn",
        "onnx": "cnn.onnx",
        "input_shape": "input:-1,3,32,32",
        "gear_option": ("dynamic_batch_size", "1,4,8"),
        "gears": [[1], [4], [8]],
        "inputs": lambda g: [("input", "f32", [g[0], 3, 32, 32])],
    },
    {
        "name": "dims",
        "onnx": "gear_dims.onnx",
        "input_shape": "data:1,1,40,-1;label:1,-1;mask:-1,-1",
        "gear_option": ("dynamic_dims", "20,20,1,1;40,40,2,2;80,60,4,4"),
        "gears": [[20, 20, 1, 1], [40, 40, 2, 2], [80, 60, 4, 4]],
        "inputs": lambda g: [
            ("data", "f32", [1, 1, 40, g[0]]),
            ("label", "i32", [1, g[1]]),
            ("mask", "f32", [g[2], g[3]]),
        ],
    },
    {
        "name": "transformer",
        "onnx": "transformer.onnx",
        "input_shape": "x:1,-1,64",
        "gear_option": ("dynamic_dims", "16;32;64"),
        "gears": [[16], [32], [64]],
        "inputs": lambda g: [("x", "f32", [1, g[0], 64])],
    },
    {
        "name": "batch",
        "onnx": "gear_batch.onnx",
        "input_shape": "x:-1,4,8,8",
        "gear_option": ("dynamic_batch_size", "1,2,4"),
        "gears": [[1], [2], [4]],
        "inputs": lambda g: [("x", "f32", [g[0], 4, 8, 8])],
    },
    {
        "name": "image",
        "onnx": "gear_image.onnx",
        "input_shape": "img:1,3,-1,-1",
        "gear_option": ("dynamic_image_size", "16,16;32,32"),
        "gears": [[16, 16], [32, 32]],
        "inputs": lambda g: [("img", "f32", [1, 3, g[0], g[1]])],
    },
    {
        "name": "torch_cnn",
        "onnx": os.path.join("torch", "cnn_torch.onnx"),
        "input_shape": "input:-1,3,32,32",
        "gear_option": ("dynamic_batch_size", "1,4"),
        "gears": [[1], [4]],
        "inputs": lambda g: [("input", "f32", [g[0], 3, 32, 32])],
    },
]

# Each example kernel: block_dim and --args (seeded buffers; named ones are saved).
KERNEL_CASES = [
    ("vadd_f16_db", 32, "x=rand:f16:1048576:7,y=rand:f16:1048576:8,z=zeros:2097152,1048576"),
    ("dma_stream", 32, "src=rand:u8:2097152:3,2097152"),
    ("matmul_256", 4, "a=rand:f16:65536:1,b=rand:f16:65536:2,c=zeros:262144"),
    ("mmad_loop", 2, "a=rand:f16:32768:4,b=rand:f16:32768:5,c=zeros:65536,3"),
]


def run(cmd, log):
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"refset: command failed (exit {done.returncode}): {' '.join(cmd)}")


def build(gearsim, work):
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    log = open(os.path.join(work, "commands.log"), "w")

    # Traces at instruction level: every record a change could disturb.
    run([gearsim, "demo", "--trace", os.path.join(work, "demo.gtrace"),
         "--trace_level", "instruction"], log)

    for case in MODEL_CASES:
        name = case["name"]
        folder = os.path.join(work, name)
        os.makedirs(folder)
        option, value = case["gear_option"]
        for sink in (False, True):
            mode = "sink" if sink else "nonsink"
            out = os.path.join(folder, f"{name}_{mode}")
            cmd = [
                gearsim, "compile",
                "--model=" + os.path.join(MODELS, case["onnx"]),
                "--output=" + out, "--framework=5",
                "--input_shape=" + case["input_shape"],
                f"--{option}={value}",
            ]
            if sink:
                cmd.append("--getnext_sink")
            run(cmd, log)
            for gi, gear in enumerate(case["gears"]):
                files = []
                for k, (iname, dtype, shape) in enumerate(case["inputs"](gear)):
                    path = os.path.join(folder, f"in_g{gi}_{iname}.npy")
                    if not os.path.exists(path):
                        write_npy(path, dtype, shape, seed=1000 * gi + k + 1)
                    files.append(path)
                tag = f"{mode}_g{gi}"
                run([
                    gearsim, "run", "--model=" + out + ".om",
                    "--input=" + ",".join(files),
                    "--output_dir=" + os.path.join(folder, "out_" + tag),
                    "--trace=" + os.path.join(folder, tag + ".gtrace"),
                    "--trace_level=instruction",
                ], log)

    kfolder = os.path.join(work, "kernels")
    os.makedirs(kfolder)
    for kname, block_dim, args in KERNEL_CASES:
        # Relative to the workspace root (the commands run there): a kernel trace records
        # its source's path, which must not depend on where the checkout is.
        source = os.path.join("host", "examples", "kernels", kname + ".s")
        run([gearsim, "kernel", "asm", source, "-o", os.path.join(kfolder, kname + ".bin")], log)
        run([
            gearsim, "kernel", "run", source, "--block_dim", str(block_dim), "--args", args,
            "--trace", os.path.join(kfolder, kname + ".gtrace"),
            "--output_dir", os.path.join(kfolder, "out_" + kname),
        ], log)
    log.close()


def hashes(work):
    """SHA-256 of every produced file but the inputs and the log, by relative path."""
    rows = {}
    for folder, _, names in os.walk(work):
        for n in names:
            path = os.path.join(folder, n)
            rel = os.path.relpath(path, work).replace(os.sep, "/")
            if rel == "commands.log" or (n.startswith("in_") and n.endswith(".npy")):
                continue
            with open(path, "rb") as f:
                rows[rel] = hashlib.sha256(f.read()).hexdigest()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gearsim", required=True, help="the gearsim binary")
    p.add_argument("--work", required=True, help="folder to build the set in (emptied)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", help="record the hashes in this file")
    g.add_argument("--check", help="compare the hashes with this file")
    a = p.parse_args()

    build(os.path.abspath(a.gearsim), os.path.abspath(a.work))
    rows = hashes(a.work)
    if a.write:
        tmp = a.write + ".tmp"
        with open(tmp, "w") as f:
            for rel in sorted(rows):
                f.write(f"{rows[rel]}  {rel}\n")
        os.replace(tmp, a.write)
        print(f"refset: {len(rows)} files recorded in {a.write}")
        return
    expected = {}
    with open(a.check) as f:
        for line in f:
            digest, rel = line.rstrip("\n").split("  ", 1)
            expected[rel] = digest
    bad = 0
    for rel in sorted(set(expected) | set(rows)):
        if rel not in rows:
            print(f"missing  {rel}")
        elif rel not in expected:
            print(f"new      {rel}")
        elif rows[rel] != expected[rel]:
            print(f"differs  {rel}")
        else:
            continue
        bad += 1
    same = len(rows) - sum(1 for r in rows if r not in expected or rows[r] != expected[r])
    print(f"refset: {same} of {len(expected)} files byte-identical, {bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

"""A gear sweep spread over a local Dask cluster: every (gear, mode) point runs in its own
worker process with its own simulated device, and the figures come back as one table.

    pip install "dask[distributed]"     # optional: the gearsim package does not need it
    python dask_sweep.py tests/models/cnn.onnx [OUT_DIR]

Each task compiles nothing: the models are compiled once here and the workers load the
`.om` files. Results do not depend on which worker ran what (the simulator is deterministic).
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
from dask.distributed import Client, LocalCluster

import gearsim


def run_point(om, batch, timing_only):
    """One point on a worker: the execution time and the gear it took."""
    session = gearsim.InferSession(om, timing_only=timing_only)
    x = np.zeros((batch, 3, 32, 32), np.float32)
    session.infer([x], mode="dymbatch")
    r = session.last_run
    return {"om": Path(om).stem, "path": om, "batch": batch, "gear": r["gear"],
            "execute_us": r["execute_us"], "h2d_bytes": r["h2d_bytes"]}


def main(onnx_path, out=None, workers=2):
    out = Path(out or tempfile.mkdtemp())
    models = {}
    for name, sink in (("nonsink", False), ("sink", True)):
        gearsim.compile(onnx_path, out / name, input_shape="input:-1,3,32,32",
                        dynamic_batch_size="1,2,4,8", getnext_sink=sink)
        models[name] = str(out / f"{name}.om")
    points = [(om, b) for om in models.values() for b in (1, 2, 4, 8)]
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True) as cluster, \
            Client(cluster) as client:
        futures = client.map(run_point, [p[0] for p in points], [p[1] for p in points],
                             [True] * len(points), pure=False)
        rows = client.gather(futures)
    rows.sort(key=lambda r: (r["om"], r["batch"]))
    print(f"{'model':<8} {'batch':>5} {'gear':>4} {'execute_us':>11} {'h2d_bytes':>10}")
    for r in rows:
        print(f"{r['om']:<8} {r['batch']:>5} {r['gear']:>4} {r['execute_us']:>11.3f} "
              f"{r['h2d_bytes']:>10}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/models/cnn.onnx",
         sys.argv[2] if len(sys.argv) > 2 else None)

"""The `gearsim` package as a Python user meets it: compile with atc's options and E-codes,
ais_bench-style sessions in every mode checked against onnxruntime, sink vs non-sink, profiles,
traces, bad input, Ctrl-C and the GIL."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gearsim

ROOT = Path(__file__).resolve().parents[3]
CNN = ROOT / "tests" / "models" / "cnn.onnx"
EXAMPLE = ROOT / "host" / "python" / "examples" / "every_gear.py"


def cnn_input(batch, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32), dtype=np.float32)


@pytest.fixture(scope="module")
def cnn_om(tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn") / "cnn"
    gearsim.compile(CNN, out, input_shape="input:-1,3,32,32", dynamic_batch_size="1,2,4",
                    soc_version="ascend310p")
    return str(out) + ".om"


@pytest.fixture(scope="module")
def reference():
    return ort.InferenceSession(str(CNN))


def test_the_example_compiles_runs_every_gear_and_prints_the_profile(tmp_path):
    assert len(EXAMPLE.read_text().splitlines()) <= 15
    r = subprocess.run([sys.executable, str(EXAMPLE), str(CNN)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for gear, batch in enumerate([1, 2, 4]):
        assert f"gear {gear} (batch {batch}):" in r.stdout
    assert "/conv1/Conv_ascend_mbatch_batch_2" in r.stdout
    assert "MapIndex" in r.stdout


def test_every_gear_matches_onnxruntime_and_reports_its_run(cnn_om, reference):
    s = gearsim.InferSession(cnn_om)
    assert [d.name for d in s.get_inputs()] == ["input"]
    assert s.get_inputs()[0].shape == [-1, 3, 32, 32]
    assert s.get_inputs()[0].datatype == np.float32
    assert [d.name for d in s.get_outputs()] == ["logits"]
    assert s.gears == [[1], [2], [4]] and s.gear_mode == "batch"
    for gear, batch in enumerate([1, 2, 4]):
        x = cnn_input(batch, gear)
        (y,) = s.infer([x], mode="dymbatch")
        assert y.shape == (batch, 10) and y.dtype == np.float32
        np.testing.assert_allclose(y, reference.run(None, {"input": x})[0], rtol=2e-2, atol=2e-2)
        r = s.last_run
        assert r["gear"] == gear and r["cur_dynamic_dims"] == [batch]
        assert r["path"] == "gear"
        assert r["h2d_transfers"] >= 1 and r["d2h_bytes"] == batch * 10 * 4
        assert [p["name"] for p in r["phases"]] == ["h2d", "map_index", "branch", "d2h"]
        branch = next(p for p in r["phases"] if p["name"] == "branch")
        ops = [o for o in r["ops"] if o["OP Type"] != "MapIndex"]
        total = sum(o["Task Duration(us)"] for o in ops)
        assert 0.95 * branch["us"] <= total <= branch["us"], (total, branch)
        assert all(0.0 <= o["mac_ratio"] <= 1.0 for o in ops if o["mac_ratio"] is not None)
    summary = s.summary()
    assert summary["loops"] == 3
    assert summary["min_ms"] <= summary["median_ms"] <= summary["max_ms"]
    # A dict by input name works too; outputs are writable arrays.
    (y,) = s.infer({"input": cnn_input(2)}, mode="dymbatch")
    y[0, 0] = 1.0


def test_sink_and_non_sink_agree_on_outputs_and_dims(tmp_path, cnn_om):
    out = tmp_path / "cnn_sink"
    gearsim.compile(CNN, out, input_shape="input:-1,3,32,32", dynamic_batch_size="1,2,4",
                    soc_version="ascend310p", getnext_sink=True)
    sink = gearsim.InferSession(str(out) + ".om")
    plain = gearsim.InferSession(cnn_om)
    assert sink.is_sink and not plain.is_sink
    x = cnn_input(2, 7)
    (a,) = plain.infer([x], mode="dymbatch")
    sink.enqueue([x])
    (b,) = sink.run_queued()
    np.testing.assert_array_equal(a, b)
    assert sink.last_run["cur_dynamic_dims"] == plain.last_run["cur_dynamic_dims"] == [2]
    phases = [p["name"] for p in sink.last_run["phases"]]
    assert "getnext" in phases and "get_dynamic_dims" in phases and "h2d" not in phases
    (c,) = sink.infer([x], mode="dymbatch")
    np.testing.assert_array_equal(a, c)


def test_bad_feeds_name_the_input_with_acl_s_code(cnn_om):
    s = gearsim.InferSession(cnn_om)
    cases = [
        ([cnn_input(2).astype(np.float16)], "dymbatch", "100000", "the model takes float32"),
        ([cnn_input(2), cnn_input(2)], "dymbatch", "100000", "takes 1 input(s)"),
        ([np.zeros((2, 3, 30, 32), np.float32)], "dymbatch", "100000", "input"),
        ([cnn_input(3)], "dymbatch", "E13025", "not in the dynamic dimension list"),
        (["not an array"], "dymbatch", "100000", "expected a numpy array"),
        ({"image": cnn_input(2)}, "dymbatch", "100000", "no input named 'image'"),
    ]
    for feeds, mode, code, says in cases:
        with pytest.raises(gearsim.GearsimError) as e:
            s.infer(feeds, mode=mode)
        assert e.value.code == code, (says, e.value.message)
        assert says in e.value.message
    for mode, says in [("static", "use mode='dymbatch'"), ("dymhw", "image_size gears"),
                       ("dymshape", "hybrid=True"), ("fast", "mode must be one of")]:
        with pytest.raises(gearsim.GearsimError, match=says.replace("(", r"\(")):
            s.infer([cnn_input(2)], mode=mode)
    # The session still works after every refusal.
    assert s.infer([cnn_input(1)], mode="dymbatch")[0].shape == (1, 10)


def test_chip_settings_reach_the_run_and_a_bad_key_is_named(tmp_path, cnn_om):
    x = cnn_input(2)
    base = gearsim.InferSession(cnn_om, timing_only=True)
    base.infer([x], mode="dymbatch")
    slow = gearsim.InferSession(cnn_om, timing_only=True,
                                set={"scheduler.kernel_launch_ns": 50000})
    slow.infer([x], mode="dymbatch")
    kernels = len(base.last_run["ops"])
    added = slow.last_run["execute_us"] - base.last_run["execute_us"]
    # Every kernel of the run (MapIndex and the branch's) pays the longer launch once.
    assert added > 0.9 * kernels * (50.0 - 2.0), (added, kernels)
    with pytest.raises(gearsim.GearsimError, match="no key `kernel_launch` in `scheduler`"):
        gearsim.InferSession(cnn_om, set={"scheduler.kernel_launch": 1})
    with pytest.raises(gearsim.GearsimError, match="expected an integer, got `fast`"):
        gearsim.compile(CNN, tmp_path / "c", soc_version="ascend310p",
                        set={"scheduler.kernel_launch_ns": "fast"})
    assert not (tmp_path / "c.om").exists()


def test_compile_errors_carry_ge_s_codes_and_write_nothing(tmp_path):
    out = tmp_path / "bad"
    cases = [
        (dict(input_shape="input:-1,3,32,32", dynamic_batch_size="1,1"), "E10039"),
        (dict(input_shape="input:-1,3,32,32", dynamic_batch_size="1,2", framework=3), "E10001"),
        (dict(input_shape="input:-1,3,32,32", dynamic_batch_size="1,2",
              precision_mode="fastest"), "E10001"),
        (dict(input_shape="input:-1,3,32,32", dynamic_batch_size="1,2",
              gear_table_layout="diagonal"), None),
    ]
    for opts, code in cases:
        with pytest.raises(gearsim.GearsimError) as e:
            gearsim.compile(CNN, out, **opts)
        assert e.value.code == code, e.value.message
        assert not (tmp_path / "bad.om").exists()
    with pytest.raises(gearsim.GearsimError, match="unknown option `turbo`"):
        gearsim.compile(CNN, out, turbo=True)
    with pytest.raises(gearsim.GearsimError, match="cannot read"):
        gearsim.compile(tmp_path / "missing.onnx", out)


def test_a_corrupt_model_or_trace_raises_and_never_crashes(tmp_path, cnn_om):
    data = bytearray(Path(cnn_om).read_bytes())
    for at in (0, 100, len(data) // 2, len(data) - 1):
        bad = bytearray(data)
        bad[at] ^= 0x5A
        path = tmp_path / f"bad_{at}.om"
        path.write_bytes(bad)
        with pytest.raises(gearsim.GearsimError):
            gearsim.InferSession(path)
    (tmp_path / "short.om").write_bytes(data[:10])
    with pytest.raises(gearsim.GearsimError):
        gearsim.InferSession(tmp_path / "short.om")
    (tmp_path / "bad.gtrace").write_bytes(b"GEARTRC\0" + bytes(200))
    with pytest.raises(gearsim.GearsimError):
        gearsim.Trace(tmp_path / "bad.gtrace")


def test_profiles_and_traces_as_tables(tmp_path, cnn_om):
    prof, trace = tmp_path / "prof", tmp_path / "run.gtrace"
    with gearsim.InferSession(cnn_om, profile=prof, trace=trace, trace_level="instruction") as s:
        for batch in (1, 4):
            s.infer([cnn_input(batch)], mode="dymbatch")
    rows = (prof / "op_summary.csv").read_text().splitlines()
    assert rows[0].startswith("Model Name,Infer ID,Stream ID,Task ID,Op Name,OP Type,Task Type")
    assert any(r.startswith("cnn,1,") for r in rows)
    assert json.loads((prof / "summary.json").read_text())["npu_compute_time"]["loops"] == 2
    t = gearsim.Trace(trace)
    ops = t.ops()
    assert ops and all(o["duration_us"] > 0 for o in ops)
    assert any("/conv1/Conv_ascend_mbatch_batch_2" in o["name"] for o in ops)
    phases = {p["phase"]: p for p in t.phases()}
    assert phases["branch"]["count"] == 2 and phases["H2D"]["count"] >= 2
    assert any(l["kind"] == "pipe" and l["busy_us"] > 0 for l in t.lanes())
    assert t.summary()["records"] > 0
    # Perfetto's protobuf: a fifth of the JSON or less, valid for a schema-less decoder.
    proto = t.export(tmp_path / "run.pftrace")
    json_bytes = t.export(tmp_path / "run.json", format="perfetto")
    assert 0 < 5 * proto <= json_bytes, (proto, json_bytes)
    raw = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--decode_raw"],
                         stdin=open(tmp_path / "run.pftrace", "rb"), capture_output=True,
                         timeout=120)
    assert raw.returncode == 0, raw.stderr
    begins = raw.stdout.count(b"  9: 1\n")
    spans = sum(1 for e in json.loads((tmp_path / "run.json").read_text())["traceEvents"]
                if e["ph"] == "X")
    assert begins >= spans > 0, (begins, spans)
    assert t.export(tmp_path / "k.pftrace", level="kernel", cores=[0]) < proto
    with pytest.raises(gearsim.GearsimError, match="level must be"):
        t.export(tmp_path / "x", level="pipes")


def test_traces_record_kernels_by_default(tmp_path, cnn_om):
    with gearsim.InferSession(cnn_om, trace=tmp_path / "k.gtrace") as s:
        s.infer([cnn_input(4)], mode="dymbatch")
    lanes = gearsim.Trace(tmp_path / "k.gtrace").lanes()
    kinds = {l["kind"] for l in lanes}
    assert "kernel" in kinds and "pipe" not in kinds, kinds
    assert any(l["kind"] == "kernel" and l["busy_us"] > 0 for l in lanes)
    with pytest.raises(gearsim.GearsimError, match="trace_level"):
        gearsim.InferSession(cnn_om, trace=tmp_path / "x.gtrace", trace_level="pipes")


def big_matmul(path, n, count=1):
    """A chain of `count` fp32 MatMuls of an n x n input by one n x n constant (each keeps a
    matrix of ones): seconds of functional work."""
    w = numpy_helper.from_array(np.ones((n, n), np.float32) / n, "w")
    names = ["x"] + [f"h{i}" for i in range(1, count)] + ["y"]
    g = helper.make_graph(
        [helper.make_node("MatMul", [a, "w"], [b]) for a, b in zip(names, names[1:])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def test_ctrl_c_interrupts_a_long_run_cleanly(tmp_path):
    # About 0.8 s of host time a MatMul in full mode on an idle core (more when loaded): the
    # run must still be going when the signal comes a second after it starts.
    big_matmul(tmp_path / "mm.onnx", 4096, count=12)
    gearsim.compile(tmp_path / "mm.onnx", tmp_path / "mm", precision_mode="must_keep_origin_dtype")
    script = (
        "import sys, numpy as np, gearsim\n"
        f"s = gearsim.InferSession({str(tmp_path / 'mm.om')!r})\n"
        "print('ready', flush=True)\n"
        "try:\n"
        "    s.infer([np.ones((4096, 4096), np.float32)])\n"
        "    print('finished')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
        "    try:\n"
        "        s.infer([np.ones((4096, 4096), np.float32)])\n"
        "    except gearsim.GearsimError as e:\n"
        "        print('then:', e.message.splitlines()[0])\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    started = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert time.monotonic() - started < 10, "stopped within seconds"
    assert p.returncode == 0, out
    assert "interrupted" in out and "finished" not in out
    assert "then:" in out


def test_the_gil_is_released_while_the_simulator_runs(tmp_path):
    big_matmul(tmp_path / "mm.onnx", 2048)  # about 0.15 s of host time in full mode
    gearsim.compile(tmp_path / "mm.onnx", tmp_path / "mm", precision_mode="must_keep_origin_dtype")
    s = gearsim.InferSession(tmp_path / "mm.om")
    x = np.ones((2048, 2048), np.float32)
    done = threading.Event()
    result = {}

    def work():
        result["y"] = s.infer([x])[0]
        done.set()

    ticks = 0
    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    np.testing.assert_allclose(result["y"], np.ones((2048, 2048)), rtol=1e-3)
    assert ticks >= 20, f"the main thread ran only {ticks} times during the run"
    assert os.cpu_count() >= 1


def test_pad_to_gear_matches_onnxruntime_between_gears_and_refuses_mixed_rows(
        tmp_path, reference):
    out = tmp_path / "cnn148"
    gearsim.compile(CNN, out, input_shape="input:-1,3,32,32", dynamic_batch_size="1,4,8",
                    soc_version="ascend310p")
    s = gearsim.InferSession(str(out) + ".om")
    for b in range(1, 9):
        x = cnn_input(b, b)
        (y,) = s.infer([x], mode="dymbatch", pad_to_gear=True)
        assert y.shape == (b, 10)
        np.testing.assert_allclose(y, reference.run(None, {"input": x})[0], rtol=2e-2, atol=2e-2)
        padded = s.last_run["padded"]
        if b in (1, 4, 8):
            assert padded is None
        else:
            to = 4 if b < 4 else 8
            assert (padded["from"], padded["to"]) == (b, to)
            assert padded["wasted"] == pytest.approx(1 - b / to)
            assert "rows are independent" in padded["check"]
    with pytest.raises(gearsim.GearsimError, match="larger than every gear"):
        s.infer([cnn_input(9)], mode="dymbatch", pad_to_gear=True)
    # y = x - mean(x over the batch): every row depends on the others.
    g = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[0]),
         helper.make_node("Sub", ["x", "m"], ["y"])], "mix",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "mix.onnx")
    gearsim.compile(tmp_path / "mix.onnx", tmp_path / "mix", input_shape="x:-1,16",
                    dynamic_batch_size="1,2,4")
    m = gearsim.InferSession(tmp_path / "mix.om")
    with pytest.raises(gearsim.GearsimError, match="mixes rows of the batch"):
        m.infer([np.ones((3, 16), np.float32)], mode="dymbatch", pad_to_gear=True)
    assert m.infer([np.ones((2, 16), np.float32)], mode="dymbatch", pad_to_gear=True)[0].shape \
        == (2, 16)


def test_a_sweep_over_a_local_dask_cluster_gives_the_serial_figures(tmp_path):
    example = EXAMPLE.parent / "dask_sweep.py"
    r = subprocess.run([sys.executable, str(example), str(CNN), str(tmp_path)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert len(rows) == 8, r.stdout
    for model, batch, gear, execute_us, h2d in rows:
        # The same point run here, serially, gives the same figures: nothing depends on the
        # worker that ran it.
        s = gearsim.InferSession(tmp_path / f"{model}.om", timing_only=True)
        s.infer([np.zeros((int(batch), 3, 32, 32), np.float32)], mode="dymbatch")
        assert s.last_run["gear"] == int(gear)
        assert f"{s.last_run['execute_us']:.3f}" == execute_us
        assert s.last_run["h2d_bytes"] == int(h2d)

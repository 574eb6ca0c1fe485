"""Compile a gear model, run every gear, check against onnxruntime, print the per-op profile."""
import sys
import numpy as np, onnxruntime as ort, gearsim

onnx_path = sys.argv[1] if len(sys.argv) > 1 else "tests/models/cnn.onnx"
gearsim.compile(onnx_path, "cnn", input_shape="input:-1,3,32,32", dynamic_batch_size="1,2,4")
session, reference = gearsim.InferSession("cnn.om"), ort.InferenceSession(onnx_path)
for [batch] in session.gears:
    x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32), dtype=np.float32)
    y = session.infer([x], mode="dymbatch")[0]
    np.testing.assert_allclose(y, reference.run(None, {"input": x})[0], rtol=2e-2, atol=2e-2)
    print(f"gear {session.last_run['gear']} (batch {batch}): {session.last_run['execute_us']:.1f} us")
    for op in session.last_run["ops"]:
        print(f"  {op['Op Name']:<48} {op['OP Type']:<20} {op['Task Duration(us)']:8.3f} us")

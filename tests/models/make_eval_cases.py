"""Builds the reference-evaluator fixtures in tests/models/eval/ with the `onnx` package only.

Each case is one tiny ONNX model (usually a single node) plus a JSON file with seeded random
inputs and the outputs `onnx.reference.ReferenceEvaluator` computes for them. The Rust test
`host/tests/all/eval.rs` imports every model with gearsim's importer, evaluates it with
`compiler::eval` and compares, so the oracle the device kernels are checked against is itself
checked against ONNX's own reference implementation. See README.md for the command; running it
again gives byte-identical files.

JSON layout (one file per case, `<name>.json` next to `<name>.onnx`):

    {"name": ..., "op": ..., "opset": ..., "model": "<name>.onnx",
     "inputs":  [{"name": ..., "dtype": "f32", "dims": [...], "values": [...]}, ...],
     "outputs": [{"name": ..., "dtype": ..., "dims": [...], "values": [...]}, ...]}

Floats are strings: the shortest decimal that reads back to the same value of the tensor's own
type ("nan", "inf" and "-inf" spelled so), so they round-trip exactly; integers and bools
(0/1) are JSON numbers.
"""

import json
import os
import shutil

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "eval")
RNG = np.random.default_rng(20240917)

# numpy dtype -> gearsim's short name.
NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(np.float64): "f64",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint8): "u8",
    np.dtype(np.bool_): "bool",
}

CASES = []
# Whole committed models evaluated as they are: (name, file relative to this directory, feeds).
MODEL_CASES = []


def f32(*shape, scale=1.0):
    """Standard-normal float32 values."""
    return np.asarray(RNG.standard_normal(shape) * scale).astype(np.float32)


def pos32(*shape, lo=0.1, hi=4.0):
    """Positive float32 values (for Sqrt, Pow bases, variances)."""
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def ints(dtype, lo, hi, *shape):
    """Uniform integers in [lo, hi)."""
    return RNG.integers(lo, hi, shape).astype(dtype)


def i64(values):
    """A 1-D int64 array (shape-like parameters)."""
    return np.array(values, dtype=np.int64)


def case(name, op, nodes, feeds, inits=None, opset=17):
    """Registers a case: `nodes` (one node or a list) over graph inputs `feeds` and
    initializers `inits` (both name -> array, in order); the graph outputs are the last node's
    non-empty outputs."""
    if not isinstance(nodes, list):
        nodes = [nodes]
    CASES.append((name, op, nodes, dict(feeds), dict(inits or {}), opset))


def node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=op.lower(), **attrs)


def fmt_float(v, dtype):
    """The shortest decimal that reads back to `v` in its own type."""
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return np.format_float_scientific(dtype.type(v), unique=True)


def tensor_json(name, a):
    a = np.asarray(a)
    dt = a.dtype
    if dt.kind == "f":
        values = [fmt_float(v, dt) for v in a.ravel()]
    else:
        values = [int(v) for v in a.ravel()]
    return {"name": name, "dtype": NAMES[dt], "dims": list(a.shape), "values": values}


def build(name, op, nodes, feeds, inits, opset):
    """Makes the model, runs the reference evaluator and writes both files."""
    outputs = [o for o in nodes[-1].output if o]
    graph_inputs = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    initializers = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    untyped = [onnx.ValueInfoProto(name=o) for o in outputs]
    opsets = [helper.make_opsetid("", opset)]

    def make(graph_outputs):
        graph = helper.make_graph(nodes, name, graph_inputs, graph_outputs, initializers)
        return helper.make_model(
            graph,
            opset_imports=opsets,
            producer_name="gearsim-make-eval-cases",
            producer_version="1",
            ir_version=helper.find_min_ir_version_for(opsets),
        )

    results = ReferenceEvaluator(make(untyped)).run(None, feeds)
    results = [np.asarray(r) for r in results]
    typed = [
        helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(r.dtype), r.shape)
        for o, r in zip(outputs, results)
    ]
    model = make(typed)
    onnx.checker.check_model(model, full_check=True)
    with open(os.path.join(OUT, name + ".onnx"), "wb") as f:
        f.write(model.SerializeToString())
    doc = {
        "name": name,
        "op": op,
        "opset": opset,
        "model": name + ".onnx",
        "inputs": [tensor_json(k, v) for k, v in feeds.items()],
        "outputs": [tensor_json(o, r) for o, r in zip(outputs, results)],
    }
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Elementwise unary.

case("sqrt", "Sqrt", node("Sqrt", ["x"]), {"x": pos32(3, 5)})
case("sqrt_f64", "Sqrt", node("Sqrt", ["x"]), {"x": pos32(7).astype(np.float64)})
case("erf", "Erf", node("Erf", ["x"]), {"x": f32(2, 3, 5, scale=1.5)})
case("relu", "Relu", node("Relu", ["x"]), {"x": f32(4, 7)})
case("relu_i32", "Relu", node("Relu", ["x"]), {"x": ints(np.int32, -50, 50, 11)}, opset=14)
case("relu_f16", "Relu", node("Relu", ["x"]), {"x": f32(9).astype(np.float16)})
case("sigmoid", "Sigmoid", node("Sigmoid", ["x"]), {"x": f32(3, 7, scale=4.0)})
case("tanh", "Tanh", node("Tanh", ["x"]), {"x": f32(5, 3, scale=2.0)})
case("gelu_none", "Gelu", node("Gelu", ["x"]), {"x": f32(2, 9, scale=2.0)}, opset=20)
case(
    "gelu_tanh",
    "Gelu",
    node("Gelu", ["x"], approximate="tanh"),
    {"x": f32(2, 9, scale=2.0)},
    opset=20,
)
case("clip_min_max", "Clip", node("Clip", ["x", "lo", "hi"]), {"x": f32(3, 5)},
     {"lo": np.array(-0.5, np.float32), "hi": np.array(0.75, np.float32)})
case("clip_min_only", "Clip", node("Clip", ["x", "lo"]), {"x": f32(13)},
     {"lo": np.array(0.1, np.float32)})
case("clip_max_only", "Clip", node("Clip", ["x", "", "hi"]), {"x": f32(2, 6)},
     {"hi": np.array(-0.2, np.float32)})
case("clip_none", "Clip", node("Clip", ["x"]), {"x": f32(6)})
case("clip_i32", "Clip", node("Clip", ["x", "lo", "hi"]), {"x": ints(np.int32, -20, 20, 12)},
     {"lo": np.array(-5, np.int32), "hi": np.array(7, np.int32)})
case("clip_runtime_bounds", "Clip", node("Clip", ["x", "lo", "hi"]),
     {"x": f32(4, 4), "lo": np.array(-0.3, np.float32), "hi": np.array(0.4, np.float32)})
case("identity_i64", "Identity", node("Identity", ["x"]), {"x": ints(np.int64, -9, 9, 2, 3)})

# ---------------------------------------------------------------------------------------------
# Broadcasting binaries.

case("add_same", "Add", node("Add", ["a", "b"]), {"a": f32(3, 4), "b": f32(3, 4)})
case("add_broadcast", "Add", node("Add", ["a", "b"]), {"a": f32(3, 1, 5), "b": f32(4, 5)})
case("add_i32_wrap", "Add", node("Add", ["a", "b"]),
     {"a": ints(np.int32, 2**30, 2**31 - 1, 8), "b": ints(np.int32, 2**30, 2**31 - 1, 8)})
case("add_u8_wrap", "Add", node("Add", ["a", "b"]),
     {"a": ints(np.uint8, 0, 256, 2, 5), "b": ints(np.uint8, 0, 256, 5)})
case("add_f16", "Add", node("Add", ["a", "b"]),
     {"a": f32(3, 4).astype(np.float16), "b": f32(1, 4).astype(np.float16)})
case("sub_scalar", "Sub", node("Sub", ["a", "b"]), {"a": f32(2, 3, 4), "b": f32()})
case("sub_i64", "Sub", node("Sub", ["a", "b"]),
     {"a": ints(np.int64, -1000, 1000, 3, 1), "b": ints(np.int64, -1000, 1000, 1, 4)})
case("mul_broadcast", "Mul", node("Mul", ["a", "b"]), {"a": f32(2, 1, 3), "b": f32(2, 4, 1)})
case("mul_i8_wrap", "Mul", node("Mul", ["a", "b"]),
     {"a": ints(np.int8, -128, 128, 10), "b": ints(np.int8, -128, 128, 10)})
case("mul_f64", "Mul", node("Mul", ["a", "b"]),
     {"a": f32(5).astype(np.float64), "b": f32(5).astype(np.float64)})
case("div_f32", "Div", node("Div", ["a", "b"]), {"a": f32(3, 5), "b": pos32(5, lo=0.5)})
case("div_i32_trunc", "Div", node("Div", ["a", "b"]),
     {"a": ints(np.int32, -100, 100, 12),
      "b": np.array([3, -3, 7, -7, 1, -1, 5, -5, 2, -2, 9, -9], np.int32)})
case("pow_f32", "Pow", node("Pow", ["a", "b"]), {"a": pos32(3, 4), "b": f32(3, 4)})
case("pow_square", "Pow", node("Pow", ["a", "b"]), {"a": f32(2, 5)},
     {"b": np.array(2.0, np.float32)})
case("pow_int_exponent", "Pow", node("Pow", ["a", "b"]), {"a": f32(6)},
     {"b": np.array([0, 1, 2, 3, -1, -2], np.int64)})
case("pow_i32", "Pow", node("Pow", ["a", "b"]),
     {"a": ints(np.int32, -6, 7, 8), "b": ints(np.int32, 0, 5, 8)})
a = f32(3, 4)
b = a.copy()
b[0, :2] = f32(2)
b[2, 3] = 7.0
case("equal_f32", "Equal", node("Equal", ["a", "b"]), {"a": a, "b": b})
case("equal_i64_broadcast", "Equal", node("Equal", ["a", "b"]),
     {"a": ints(np.int64, 0, 3, 2, 3), "b": ints(np.int64, 0, 3, 3)})
case("equal_bool", "Equal", node("Equal", ["a", "b"]),
     {"a": RNG.integers(0, 2, (2, 3)).astype(bool), "b": RNG.integers(0, 2, (1, 3)).astype(bool)})
case("where_broadcast", "Where", node("Where", ["c", "a", "b"]),
     {"c": RNG.integers(0, 2, (2, 1, 4)).astype(bool), "a": f32(3, 4), "b": f32(2, 1, 1)})
case("where_i64", "Where", node("Where", ["c", "a", "b"]),
     {"c": RNG.integers(0, 2, (5,)).astype(bool), "a": ints(np.int64, -5, 5, 5),
      "b": np.array(-1, np.int64)})

# ---------------------------------------------------------------------------------------------
# Cast.


def cast_case(name, x, to):
    case(name, "Cast", node("Cast", ["x"], to=to), {"x": x})


cast_case("cast_f32_i32", np.array([-2.9, -2.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.99, 1e6, -7.25],
                                   np.float32), TensorProto.INT32)
cast_case("cast_f32_i64", f32(7, scale=100.0), TensorProto.INT64)
cast_case("cast_f32_i8", RNG.uniform(-128.9, 127.9, 9).astype(np.float32), TensorProto.INT8)
cast_case("cast_f32_u8", pos32(8, lo=0.0, hi=255.0), TensorProto.UINT8)
cast_case("cast_f32_bool", np.array([0.0, -0.0, 1.0, -2.5, 1e-30, 0.0], np.float32),
          TensorProto.BOOL)
# Exact f16 ties (1 + 2^-11 and 1 + 3 * 2^-11 sit halfway between f16 neighbours) and values
# just either side of a tie, plus overflow to infinity and a subnormal.
cast_case("cast_f32_f16",
          np.array([1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-11 + 2.0**-20,
                    1.0 + 2.0**-11 - 2.0**-20, 65504.0, 65520.0, 70000.0, -3.1415927,
                    2.0**-20, 6.1e-5, 0.1, -1234.5678], np.float32),
          TensorProto.FLOAT16)
cast_case("cast_f32_f64", f32(6), TensorProto.DOUBLE)
cast_case("cast_f64_f32", (f32(6).astype(np.float64) / 3.0), TensorProto.FLOAT)
cast_case("cast_f16_f32", f32(6).astype(np.float16), TensorProto.FLOAT)
cast_case("cast_i64_f32", np.array([0, 1, -1, 16777217, -16777219, 2**40 + 1], np.int64),
          TensorProto.FLOAT)
cast_case("cast_i32_i16_wrap", np.array([0, 32767, 32768, -32769, 70000, -5], np.int32),
          TensorProto.INT16)
cast_case("cast_bool_f32", RNG.integers(0, 2, (2, 3)).astype(bool), TensorProto.FLOAT)
cast_case("cast_u8_i8_wrap", np.array([0, 1, 127, 128, 200, 255], np.uint8), TensorProto.INT8)
cast_case("cast_i64_bool", np.array([0, 3, -1, 0, 1], np.int64), TensorProto.BOOL)
cast_case("cast_i8_i64", ints(np.int8, -128, 128, 6), TensorProto.INT64)

# ---------------------------------------------------------------------------------------------
# Convolution.

case("conv_basic", "Conv", node("Conv", ["x", "w"]), {"x": f32(1, 3, 7, 7), "w": f32(4, 3, 3, 3)})
case("conv_bias_pads_strides", "Conv",
     node("Conv", ["x", "w", "b"], pads=[1, 2, 0, 1], strides=[2, 3]),
     {"x": f32(2, 3, 9, 8)}, {"w": f32(5, 3, 3, 2), "b": f32(5)})
case("conv_dilations", "Conv", node("Conv", ["x", "w", "b"], dilations=[2, 1], pads=[2, 1, 2, 1]),
     {"x": f32(1, 2, 8, 7), "w": f32(3, 2, 3, 3), "b": f32(3)})
case("conv_groups", "Conv", node("Conv", ["x", "w"], group=2, pads=[1, 1, 1, 1]),
     {"x": f32(1, 4, 5, 6), "w": f32(6, 2, 3, 3)})
case("conv_depthwise_stride2", "Conv",
     node("Conv", ["x", "w", "b"], group=3, strides=[2, 2], pads=[1, 1, 1, 1]),
     {"x": f32(2, 3, 7, 7)}, {"w": f32(3, 1, 3, 3), "b": f32(3)})
case("conv_same_upper", "Conv", node("Conv", ["x", "w"], auto_pad="SAME_UPPER", strides=[2, 2]),
     {"x": f32(1, 2, 7, 6), "w": f32(3, 2, 4, 3)})
case("conv_same_lower", "Conv", node("Conv", ["x", "w"], auto_pad="SAME_LOWER"),
     {"x": f32(1, 2, 5, 5), "w": f32(2, 2, 2, 4)})
case("conv_valid", "Conv", node("Conv", ["x", "w"], auto_pad="VALID", strides=[1, 2]),
     {"x": f32(1, 1, 6, 9), "w": f32(2, 1, 3, 3)})
case("conv_1d", "Conv", node("Conv", ["x", "w", "b"], pads=[2, 1], strides=[2]),
     {"x": f32(2, 3, 11), "w": f32(4, 3, 3), "b": f32(4)})
case("conv_3d", "Conv", node("Conv", ["x", "w"], pads=[1, 0, 1, 1, 0, 0]),
     {"x": f32(1, 2, 4, 3, 5), "w": f32(2, 2, 2, 2, 3)})
case("conv_pointwise", "Conv", node("Conv", ["x", "w", "b"]),
     {"x": f32(3, 5, 4, 3)}, {"w": f32(7, 5, 1, 1), "b": f32(7)})
case("conv_kernel_shape_attr", "Conv", node("Conv", ["x", "w"], kernel_shape=[2, 2]),
     {"x": f32(1, 1, 3, 4), "w": f32(1, 1, 2, 2)})

# ---------------------------------------------------------------------------------------------
# Pooling. (The reference pools that take the stride-1 path do not produce indices, and its
# ceil_mode padding is right only when at most one extra element is needed, so the cases stay
# inside what it computes correctly; the evaluator follows the ONNX spec / PyTorch everywhere.)

case("maxpool_2x2", "MaxPool", node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2]),
     {"x": f32(2, 3, 6, 7)})
case("maxpool_3x3_pad", "MaxPool",
     node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
     {"x": f32(1, 2, 9, 8)})
case("maxpool_ceil", "MaxPool",
     node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
     {"x": f32(1, 2, 8, 6)})
case("maxpool_dilations", "MaxPool",
     node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[1, 1], dilations=[2, 2]),
     {"x": f32(1, 1, 6, 6)})
case("maxpool_same_upper", "MaxPool",
     node("MaxPool", ["x"], kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
     {"x": f32(1, 2, 7, 5)})
case("maxpool_indices", "MaxPool",
     node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 0]),
     {"x": f32(2, 2, 5, 6)})
case("maxpool_indices_colmajor", "MaxPool",
     node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2], storage_order=1),
     {"x": f32(1, 3, 4, 6)})
case("maxpool_1d", "MaxPool", node("MaxPool", ["x"], kernel_shape=[3], strides=[2], pads=[1, 1]),
     {"x": f32(2, 2, 9)})
case("maxpool_stride1", "MaxPool", node("MaxPool", ["x"], kernel_shape=[2, 2]),
     {"x": f32(1, 2, 4, 5)})
case("maxpool_i8", "MaxPool", node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2]),
     {"x": ints(np.int8, -128, 128, 1, 2, 4, 4)})
case("avgpool_2x2", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2]), {"x": f32(2, 3, 6, 8)})
case("avgpool_pads_exclude", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
     {"x": f32(1, 2, 7, 6)})
case("avgpool_pads_include", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
          count_include_pad=1),
     {"x": f32(1, 2, 7, 6)})
case("avgpool_ceil", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
     {"x": f32(1, 2, 5, 7)})
case("avgpool_same_upper", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
     {"x": f32(1, 1, 6, 7)})
case("avgpool_same_lower_include", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[2, 2], auto_pad="SAME_LOWER",
          count_include_pad=1),
     {"x": f32(1, 2, 4, 5)})
case("avgpool_dilations", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[1, 1], dilations=[2, 2]),
     {"x": f32(1, 2, 6, 5)}, opset=19)
case("avgpool_1d", "AveragePool",
     node("AveragePool", ["x"], kernel_shape=[4], strides=[3], pads=[1, 2]), {"x": f32(1, 3, 10)})
case("global_avgpool", "GlobalAveragePool", node("GlobalAveragePool", ["x"]),
     {"x": f32(2, 3, 5, 7)})
case("global_avgpool_1d", "GlobalAveragePool", node("GlobalAveragePool", ["x"]),
     {"x": f32(3, 4, 9)})

# ---------------------------------------------------------------------------------------------
# Matrix products.

case("matmul_2d", "MatMul", node("MatMul", ["a", "b"]), {"a": f32(3, 5), "b": f32(5, 4)})
case("matmul_1d_2d", "MatMul", node("MatMul", ["a", "b"]), {"a": f32(5), "b": f32(5, 3)})
case("matmul_2d_1d", "MatMul", node("MatMul", ["a", "b"]), {"a": f32(4, 6), "b": f32(6)})
case("matmul_1d_1d", "MatMul", node("MatMul", ["a", "b"]), {"a": f32(7), "b": f32(7)})
case("matmul_batch_broadcast", "MatMul", node("MatMul", ["a", "b"]),
     {"a": f32(2, 1, 3, 4), "b": f32(3, 4, 5)})
case("matmul_3d_2d", "MatMul", node("MatMul", ["a", "b"]), {"a": f32(2, 3, 4)},
     {"b": f32(4, 2)})
case("matmul_1d_batch", "MatMul", node("MatMul", ["a", "b"]), {"a": f32(4), "b": f32(2, 4, 3)})
case("matmul_i32", "MatMul", node("MatMul", ["a", "b"]),
     {"a": ints(np.int32, -9, 9, 2, 3), "b": ints(np.int32, -9, 9, 3, 4)})
case("gemm_basic", "Gemm", node("Gemm", ["a", "b", "c"]), {"a": f32(3, 4)},
     {"b": f32(4, 5), "c": f32(3, 5)})
case("gemm_trans_a", "Gemm", node("Gemm", ["a", "b"], transA=1), {"a": f32(4, 3), "b": f32(4, 2)})
case("gemm_trans_b_bias_row", "Gemm", node("Gemm", ["a", "b", "c"], transB=1),
     {"a": f32(2, 6)}, {"b": f32(5, 6), "c": f32(5)})
case("gemm_alpha_beta_col", "Gemm",
     node("Gemm", ["a", "b", "c"], alpha=0.5, beta=-2.0, transA=1, transB=1),
     {"a": f32(3, 4), "b": f32(2, 3), "c": f32(4, 1)})
case("gemm_scalar_c", "Gemm", node("Gemm", ["a", "b", "c"], beta=0.25),
     {"a": f32(2, 3), "b": f32(3, 3), "c": f32(1)})

# ---------------------------------------------------------------------------------------------
# Normalizations and Softmax.


def bn_params(c):
    return {"s": f32(c), "bias": f32(c), "mean": f32(c, scale=0.1), "var": pos32(c, lo=0.5, hi=2.0)}


case("batchnorm_4d", "BatchNormalization",
     node("BatchNormalization", ["x", "s", "bias", "mean", "var"], epsilon=1e-3),
     {"x": f32(2, 3, 4, 5)}, bn_params(3))
case("batchnorm_2d", "BatchNormalization",
     node("BatchNormalization", ["x", "s", "bias", "mean", "var"]), {"x": f32(4, 6)}, bn_params(6))
case("batchnorm_3d_opset14", "BatchNormalization",
     node("BatchNormalization", ["x", "s", "bias", "mean", "var"]), {"x": f32(2, 2, 7)},
     bn_params(2), opset=14)
case("layernorm_last", "LayerNormalization",
     node("LayerNormalization", ["x", "s", "b"]), {"x": f32(2, 3, 8)},
     {"s": f32(8), "b": f32(8)})
case("layernorm_axis1_stats", "LayerNormalization",
     node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"], axis=1, epsilon=1e-3),
     {"x": f32(2, 3, 4)}, {"s": f32(3, 4), "b": f32(3, 4)})
case("layernorm_no_bias_neg_axis", "LayerNormalization",
     node("LayerNormalization", ["x", "s"], axis=-2), {"x": f32(3, 2, 5)}, {"s": f32(2, 5)})
case("layernorm_scale_broadcast", "LayerNormalization",
     node("LayerNormalization", ["x", "s", "b"], axis=-2), {"x": f32(2, 3, 4)},
     {"s": f32(4), "b": f32(1, 4)})
case("softmax_last", "Softmax", node("Softmax", ["x"]), {"x": f32(3, 7, scale=3.0)})
case("softmax_axis0", "Softmax", node("Softmax", ["x"], axis=0), {"x": f32(4, 3)})
case("softmax_axis1_3d", "Softmax", node("Softmax", ["x"], axis=1), {"x": f32(2, 5, 3)},
     opset=13)

# ---------------------------------------------------------------------------------------------
# Reductions.

case("reducemean_axes_input", "ReduceMean", node("ReduceMean", ["x", "axes"]),
     {"x": f32(2, 3, 4)}, {"axes": i64([1])}, opset=18)
case("reducemean_all_keepdims0", "ReduceMean", node("ReduceMean", ["x"], keepdims=0),
     {"x": f32(3, 5)}, opset=18)
case("reducemean_attr_axes", "ReduceMean", node("ReduceMean", ["x"], axes=[0, -1]),
     {"x": f32(2, 3, 4)}, opset=13)
case("reducemean_multi_neg", "ReduceMean", node("ReduceMean", ["x", "axes"], keepdims=0),
     {"x": f32(2, 3, 4, 5)}, {"axes": i64([-1, 1])}, opset=18)
case("reducesum_axes_keep", "ReduceSum", node("ReduceSum", ["x", "axes"]),
     {"x": f32(3, 4, 2)}, {"axes": i64([-2])})
case("reducesum_keepdims0", "ReduceSum", node("ReduceSum", ["x", "axes"], keepdims=0),
     {"x": f32(2, 5, 3)}, {"axes": i64([0, 2])})
case("reducesum_noop", "ReduceSum", node("ReduceSum", ["x"], noop_with_empty_axes=1),
     {"x": f32(2, 3)})
case("reducesum_empty_axes_all", "ReduceSum", node("ReduceSum", ["x", "axes"]),
     {"x": f32(2, 3)}, {"axes": np.zeros((0,), np.int64)})
case("reducesum_i32", "ReduceSum", node("ReduceSum", ["x", "axes"], keepdims=0),
     {"x": ints(np.int32, -1000, 1000, 3, 4)}, {"axes": i64([1])})

# ---------------------------------------------------------------------------------------------
# Shape and data movement.

case("flatten_axis0", "Flatten", node("Flatten", ["x"], axis=0), {"x": f32(2, 3, 2)})
case("flatten_axis2", "Flatten", node("Flatten", ["x"], axis=2), {"x": f32(2, 3, 2, 2)})
case("flatten_neg_axis", "Flatten", node("Flatten", ["x"], axis=-1),
     {"x": ints(np.int64, 0, 9, 2, 3, 4)})
case("reshape_zero_minus_one", "Reshape", node("Reshape", ["x", "s"]), {"x": f32(2, 3, 4)},
     {"s": i64([0, -1, 2])})
case("reshape_allowzero", "Reshape", node("Reshape", ["x", "s"], allowzero=1),
     {"x": f32(2, 6)}, {"s": i64([3, 4])}, opset=14)
case("transpose_default", "Transpose", node("Transpose", ["x"]), {"x": f32(2, 3, 4)})
case("transpose_perm", "Transpose", node("Transpose", ["x"], perm=[0, 2, 3, 1]),
     {"x": f32(2, 3, 2, 5)})
case("transpose_i8", "Transpose", node("Transpose", ["x"], perm=[1, 0]),
     {"x": ints(np.int8, -9, 9, 3, 5)})
case("concat_axis1", "Concat", node("Concat", ["a", "b", "c"], axis=1),
     {"a": f32(2, 1, 3), "b": f32(2, 4, 3), "c": f32(2, 2, 3)})
case("concat_neg_axis_i64", "Concat", node("Concat", ["a", "b"], axis=-1),
     {"a": ints(np.int64, 0, 9, 3, 2), "b": ints(np.int64, 0, 9, 3, 1)})
case("slice_basic", "Slice", node("Slice", ["x", "s", "e"]), {"x": f32(5, 6)},
     {"s": i64([1, 2]), "e": i64([4, 5])})
case("slice_negative_steps", "Slice", node("Slice", ["x", "s", "e", "a", "t"]),
     {"x": f32(4, 7)}, {"s": i64([-1, 5]), "e": i64([-9, 0]), "a": i64([1, 0]),
                        "t": i64([-2, -1])})
case("slice_clamp_axes", "Slice", node("Slice", ["x", "s", "e", "a"]), {"x": f32(3, 4, 5)},
     {"s": i64([-100, 1]), "e": i64([100, 2**62]), "a": i64([-1, 1])})
case("slice_step2_i32_bounds", "Slice", node("Slice", ["x", "s", "e", "a", "t"]),
     {"x": ints(np.int32, 0, 99, 9, 4)},
     {"s": np.array([1], np.int32), "e": np.array([8], np.int32), "a": np.array([0], np.int32),
      "t": np.array([3], np.int32)})
case("slice_reverse_all", "Slice", node("Slice", ["x", "s", "e", "a", "t"]), {"x": f32(6)},
     {"s": i64([-1]), "e": i64([-(2**63)]), "a": i64([0]), "t": i64([-1])})
case("split_sizes_last_axis", "Split",
     node("Split", ["x", "s"], ["q", "k", "v"], axis=-1), {"x": f32(2, 3, 12)},
     {"s": i64([4, 4, 4])})
case("split_uneven_axis0_i32", "Split", node("Split", ["x", "s"], ["a", "b"]),
     {"x": ints(np.int32, -9, 9, 5, 3)}, {"s": i64([2, 3])})
case("split_num_outputs_opset18", "Split",
     node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3), {"x": f32(2, 7)}, opset=18)
case("gather_axis0_negative", "Gather", node("Gather", ["x", "i"]), {"x": f32(5, 3)},
     {"i": i64([0, -1, 2, -5])})
case("gather_axis1_2d_indices", "Gather", node("Gather", ["x", "i"], axis=1),
     {"x": f32(2, 6, 2), "i": np.array([[5, 0, 1], [-2, 3, 3]], np.int64)})
case("gather_scalar_index", "Gather", node("Gather", ["x", "i"], axis=-1),
     {"x": ints(np.int64, 0, 50, 3, 4)}, {"i": np.array(-3, np.int32)})
case("squeeze_axes", "Squeeze", node("Squeeze", ["x", "a"]), {"x": f32(1, 3, 1, 2)},
     {"a": i64([-2, 0])})
case("squeeze_all", "Squeeze", node("Squeeze", ["x"]), {"x": f32(1, 4, 1)})
case("unsqueeze_neg", "Unsqueeze", node("Unsqueeze", ["x", "a"]), {"x": f32(3, 2)},
     {"a": i64([-1, 0])})
case("unsqueeze_middle", "Unsqueeze", node("Unsqueeze", ["x", "a"]),
     {"x": ints(np.int32, 0, 9, 2, 3)}, {"a": i64([1, 3])})
case("shape_full", "Shape", node("Shape", ["x"]), {"x": f32(2, 3, 5)})
case("shape_start_end", "Shape", node("Shape", ["x"], start=1, end=-1), {"x": f32(2, 3, 5, 4)},
     opset=15)
case("expand_broadcast", "Expand", node("Expand", ["x", "s"]), {"x": f32(3, 1)},
     {"s": i64([2, 3, 4])})
case("expand_keep_dim", "Expand", node("Expand", ["x", "s"]),
     {"x": ints(np.int64, 0, 9, 1, 4)}, {"s": i64([3, 1])})
case("constant_value", "Constant",
     [node("Constant", [], ["k"], value=numpy_helper.from_array(f32(2, 3), "k")),
      node("Add", ["x", "k"])], {"x": f32(2, 3)})
case("constant_value_ints", "Constant",
     [node("Constant", [], ["k"], value_ints=[1, -2, 3]), node("Mul", ["x", "k"])],
     {"x": ints(np.int64, -9, 9, 2, 3)})

# ---------------------------------------------------------------------------------------------
# Small graphs: values flowing between ops, including a shape computation that folds.

case("graph_shape_chain_reshape", "Reshape",
     [node("Shape", ["x"], ["sh"]),
      node("Gather", ["sh", "zero"], ["n"], axis=0),
      node("Unsqueeze", ["n", "ax"], ["n1"]),
      node("Concat", ["n1", "minus1"], ["target"], axis=0),
      node("Reshape", ["x", "target"])],
     {"x": f32(2, 3, 4)},
     {"zero": np.array(0, np.int64), "ax": i64([0]), "minus1": i64([-1])})
case("graph_conv_bn_relu_pool", "Conv",
     [node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
      node("BatchNormalization", ["c", "s", "bias", "mean", "var"], ["n"]),
      node("Relu", ["n"], ["r"]),
      node("MaxPool", ["r"], kernel_shape=[2, 2], strides=[2, 2])],
     {"x": f32(2, 3, 6, 6)},
     {"w": f32(4, 3, 3, 3), "cb": f32(4), **bn_params(4)})


# ---------------------------------------------------------------------------------------------
# Whole models from make_models.py (op "model"): every op in them, end to end.

MODEL_CASES.append(("model_cnn_batch1", "cnn.onnx", {"input": f32(1, 3, 32, 32)}))
MODEL_CASES.append(("model_transformer_s5", "transformer.onnx", {"x": f32(1, 5, 64)}))


# ---------------------------------------------------------------------------------------------
# Issue 16's operators (after the others, so their random draws leave the earlier cases alone).

case("exp", "Exp", node("Exp", ["x"]), {"x": f32(3, 5, scale=3.0)})
case("log", "Log", node("Log", ["x"]), {"x": pos32(2, 7)})
case("abs_i32", "Abs", node("Abs", ["x"]), {"x": ints(np.int32, -50, 50, 9)})
case("abs_f32", "Abs", node("Abs", ["x"]), {"x": f32(6)})
case("neg", "Neg", node("Neg", ["x"]), {"x": f32(2, 5)})
case("neg_i64", "Neg", node("Neg", ["x"]), {"x": ints(np.int64, -9, 9, 4)})
case("reciprocal", "Reciprocal", node("Reciprocal", ["x"]), {"x": pos32(8)})
case("floor", "Floor", node("Floor", ["x"]), {"x": f32(11, scale=5.0)})
case("ceil", "Ceil", node("Ceil", ["x"]), {"x": f32(11, scale=5.0)})
case("softplus", "Softplus", node("Softplus", ["x"]), {"x": f32(3, 4, scale=6.0)})
case("softsign", "Softsign", node("Softsign", ["x"]), {"x": f32(3, 4, scale=6.0)})
case("leaky_relu", "LeakyRelu", node("LeakyRelu", ["x"], alpha=0.3), {"x": f32(10)})
case("elu", "Elu", node("Elu", ["x"], alpha=0.7), {"x": f32(10, scale=3.0)})
case("selu", "Selu", node("Selu", ["x"]), {"x": f32(10, scale=3.0)})
case("celu", "Celu", node("Celu", ["x"], alpha=2.0), {"x": f32(10, scale=3.0)})
case("hard_sigmoid", "HardSigmoid", node("HardSigmoid", ["x"], alpha=0.3, beta=0.4),
     {"x": f32(10, scale=4.0)})
case("hard_swish", "HardSwish", node("HardSwish", ["x"]), {"x": f32(10, scale=5.0)})
case("thresholded_relu", "ThresholdedRelu", node("ThresholdedRelu", ["x"], alpha=0.5),
     {"x": f32(10, scale=2.0)})
case("less_broadcast", "Less", node("Less", ["a", "b"]), {"a": f32(2, 3), "b": f32(3)})
case("greater_i32", "Greater", node("Greater", ["a", "b"]),
     {"a": ints(np.int32, -3, 3, 8), "b": ints(np.int32, -3, 3, 8)})
case("less_or_equal", "LessOrEqual", node("LessOrEqual", ["a", "b"]),
     {"a": ints(np.int8, -3, 3, 8), "b": ints(np.int8, -3, 3, 8)})
case("greater_or_equal", "GreaterOrEqual", node("GreaterOrEqual", ["a", "b"]),
     {"a": f32(4, 1), "b": f32(1, 3)})
case("and_broadcast", "And", node("And", ["a", "b"]),
     {"a": RNG.integers(0, 2, (2, 3)).astype(bool), "b": RNG.integers(0, 2, (3,)).astype(bool)})
case("or", "Or", node("Or", ["a", "b"]),
     {"a": RNG.integers(0, 2, (6,)).astype(bool), "b": RNG.integers(0, 2, (6,)).astype(bool)})
case("xor", "Xor", node("Xor", ["a", "b"]),
     {"a": RNG.integers(0, 2, (6,)).astype(bool), "b": RNG.integers(0, 2, (6,)).astype(bool)})
case("not", "Not", node("Not", ["x"]), {"x": RNG.integers(0, 2, (2, 4)).astype(bool)})
case("size", "Size", node("Size", ["x"]), {"x": f32(2, 3, 4)})
case("constant_of_shape", "ConstantOfShape",
     node("ConstantOfShape", ["s"], value=numpy_helper.from_array(np.array([3], np.int32), "v")),
     {}, {"s": i64([2, 3])})
case("reduce_max_axis", "ReduceMax", node("ReduceMax", ["x"], axes=[1], keepdims=0),
     {"x": f32(3, 4, 5)}, opset=17)
case("reduce_min_all", "ReduceMin", node("ReduceMin", ["x"]), {"x": f32(2, 6)}, opset=17)
case("reduce_max_i32", "ReduceMax", node("ReduceMax", ["x", "ax"]),
     {"x": ints(np.int32, -40, 40, 4, 3)}, {"ax": i64([0])}, opset=18)
case("range_f32", "Range", node("Range", ["s", "l", "d"]), {},
     {"s": np.array(1.5, np.float32), "l": np.array(9.0, np.float32), "d": np.array(0.7, np.float32)})
case("range_i64_down", "Range", node("Range", ["s", "l", "d"]), {},
     {"s": np.array(10, np.int64), "l": np.array(-3, np.int64), "d": np.array(-4, np.int64)})
case("trilu_upper_k1", "Trilu", node("Trilu", ["x", "k"]), {"x": f32(2, 4, 5)},
     {"k": np.array(1, np.int64)})
case("trilu_lower", "Trilu", node("Trilu", ["x"], upper=0), {"x": ints(np.int64, -9, 9, 3, 3)})
case("round_half_even", "Round", node("Round", ["x"]),
     {"x": np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7], np.float32)})
case("sign", "Sign", node("Sign", ["x"]), {"x": np.array([-3.0, 0.0, 2.0, -0.5], np.float32)})
case("isnan", "IsNaN", node("IsNaN", ["x"]),
     {"x": np.array([1.0, np.nan, -np.inf, 0.0], np.float32)})
case("isinf_negative", "IsInf", node("IsInf", ["x"], detect_positive=0),
     {"x": np.array([np.inf, -np.inf, np.nan, 2.0], np.float32)})
case("prelu_broadcast", "PRelu", node("PRelu", ["x", "s"]), {"x": f32(2, 3, 4), "s": f32(4)})
case("sum_three", "Sum", node("Sum", ["a", "b", "c"]), {"a": f32(2, 3), "b": f32(3), "c": f32(1, 3)})
case("mean_two", "Mean", node("Mean", ["a", "b"]), {"a": f32(4), "b": f32(4)})
case("max_three_nan", "Max", node("Max", ["a", "b", "c"]),
     {"a": np.array([1.0, np.nan, -2.0, 3.0], np.float32), "b": f32(4), "c": f32(1)})
case("min_u8", "Min", node("Min", ["a", "b"]),
     {"a": ints(np.uint8, 0, 256, 2, 3), "b": ints(np.uint8, 0, 256, 3)})
case("resize_linear_half_pixel", "Resize", node("Resize", ["x", "", "s"], mode="linear"),
     {"x": f32(1, 2, 3, 4)}, {"s": np.array([1.0, 1.0, 1.5, 2.0], np.float32)}, opset=19)
case("resize_nearest_sizes_i32", "Resize",
     node("Resize", ["x", "", "", "z"], coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"),
     {"x": ints(np.int32, -50, 50, 1, 2, 3, 3)}, {"z": i64([1, 2, 6, 5])}, opset=19)
case("resize_cubic_axes_antialias", "Resize",
     node("Resize", ["x", "", "s"], mode="cubic", antialias=1, axes=[3, 2]),
     {"x": f32(2, 1, 6, 7)}, {"s": np.array([0.6, 0.5], np.float32)}, opset=19)
case("instance_norm", "InstanceNormalization",
     node("InstanceNormalization", ["x", "s", "b"], epsilon=1e-3),
     {"x": f32(2, 3, 4, 5), "s": f32(3), "b": f32(3)})
case("group_norm_per_channel", "GroupNormalization",
     node("GroupNormalization", ["x", "s", "b"], num_groups=2),
     {"x": f32(2, 4, 3, 3), "s": f32(4), "b": f32(4)}, opset=21)
case("conv_transpose_stride2_bias", "ConvTranspose",
     node("ConvTranspose", ["x", "w", "b"], strides=[2, 2]),
     {"x": f32(1, 3, 4, 5)}, {"w": f32(3, 2, 2, 2), "b": f32(2)})
case("conv_transpose_pads_dilation", "ConvTranspose",
     node("ConvTranspose", ["x", "w"], strides=[3, 2], pads=[1, 0, 2, 1],
          output_padding=[1, 1], dilations=[1, 2]),
     {"x": f32(2, 4, 3, 3)}, {"w": f32(4, 3, 3, 2)})
case("conv_transpose_1d_same_upper", "ConvTranspose",
     node("ConvTranspose", ["x", "w"], strides=[2], auto_pad="SAME_UPPER"),
     {"x": f32(1, 2, 5)}, {"w": f32(2, 3, 4)})
case("gather_elements_axis1_negative", "GatherElements",
     node("GatherElements", ["x", "i"], axis=1), {"x": f32(3, 4)},
     {"i": np.array([[0, -1, 2], [3, 1, 0], [-4, 2, 2]], np.int64)})
case("gather_nd_slices_batch_dims", "GatherND",
     node("GatherND", ["x", "i"], batch_dims=1), {"x": f32(2, 3, 4)},
     {"i": np.array([[[2], [0]], [[1], [-1]]], np.int64)})
case("cast_like_f32_to_i32", "CastLike", node("CastLike", ["x", "like"]),
     {"x": np.array([-2.7, -0.5, 0.0, 1.9, 3.5], np.float32),
      "like": np.array([0], np.int32)})
case("mod_int32_mixed_signs", "Mod", node("Mod", ["x", "d"]),
     {"x": np.array([-4, 7, 5, 4, -7, 8], np.int32),
      "d": np.array([2, -3, 8, -2, 3, 5], np.int32)})
case("mod_f32_fmod_broadcast", "Mod", node("Mod", ["x", "d"], fmod=1),
     {"x": f32(2, 3, scale=5.0)}, {"d": pos32(3)})


def build_model_case(name, file, feeds):
    """Writes only the JSON of a committed model (its "model" path points one level up)."""
    model = onnx.load(os.path.join(HERE, file))
    outputs = [o.name for o in model.graph.output]
    results = [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    doc = {
        "name": name,
        "op": "model",
        "opset": opset,
        "model": "../" + file,
        "inputs": [tensor_json(k, v) for k, v in feeds.items()],
        "outputs": [tensor_json(o, r) for o, r in zip(outputs, results)],
    }
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


# MatMulInteger (drawn last, so that the cases above keep their values).
case("matmulinteger_i8", "MatMulInteger", node("MatMulInteger", ["a", "b"]),
     {"a": ints(np.int8, -128, 127, 3, 6), "b": ints(np.int8, -128, 127, 6, 4)})
case("matmulinteger_u8_zero_points", "MatMulInteger",
     node("MatMulInteger", ["a", "b", "za", "zb"]),
     {"a": ints(np.uint8, 0, 255, 2, 4, 3), "b": ints(np.uint8, 0, 255, 3, 2)},
     {"za": np.array(12, dtype=np.uint8), "zb": np.array(3, dtype=np.uint8)})


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for name, op, nodes, feeds, inits, opset in CASES:
        build(name, op, nodes, feeds, inits, opset)
    for name, file, feeds in MODEL_CASES:
        build_model_case(name, file, feeds)
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"{len(CASES) + len(MODEL_CASES)} cases, {total} bytes in {OUT}")


if __name__ == "__main__":
    main()

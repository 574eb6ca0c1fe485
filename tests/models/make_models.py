"""Builds the ONNX test models in this directory with the `onnx` package only.

The models are written as PyTorch exports them (node and weight names, the Shape -> Gather ->
Unsqueeze -> Concat -> Reshape chains of a multi-head split) but built directly with
`onnx.helper`, so no torch is needed. Weights are random from a fixed seed, so running the script
again gives byte-identical files. See README.md for the command.
"""

import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

HERE = os.path.dirname(os.path.abspath(__file__))
RNG = np.random.default_rng(20240601)


def weight(name, shape, scale=None):
    """A float32 initializer with random values (raw_data, as exporters write them)."""
    if scale is None:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        scale = 1.0 / math.sqrt(max(fan_in, 1))
    values = (RNG.standard_normal(shape) * scale).astype(np.float32)
    return numpy_helper.from_array(values, name)


def batch_norm_params(prefix, channels):
    """The four BatchNormalization initializers of a PyTorch BatchNorm2d."""
    return [
        numpy_helper.from_array(
            (1.0 + 0.1 * RNG.standard_normal(channels)).astype(np.float32), prefix + ".weight"
        ),
        numpy_helper.from_array(
            (0.1 * RNG.standard_normal(channels)).astype(np.float32), prefix + ".bias"
        ),
        numpy_helper.from_array(
            (0.1 * RNG.standard_normal(channels)).astype(np.float32), prefix + ".running_mean"
        ),
        numpy_helper.from_array(
            (1.0 + 0.1 * np.abs(RNG.standard_normal(channels))).astype(np.float32),
            prefix + ".running_var",
        ),
    ]


def bn_node(prefix, x, y):
    """A BatchNormalization node reading the initializers of `batch_norm_params`."""
    return helper.make_node(
        "BatchNormalization",
        [x, prefix + ".weight", prefix + ".bias", prefix + ".running_mean", prefix + ".running_var"],
        [y],
        name="/" + prefix + "/BatchNormalization",
        epsilon=1e-5,
        momentum=0.9,
    )


def make_model(graph, opset):
    """A model with the default-domain opset and the smallest IR version that allows it."""
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(
        graph,
        opset_imports=opsets,
        producer_name="gearsim-make-models",
        producer_version="1",
        ir_version=helper.find_min_ir_version_for(opsets),
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def cnn():
    """A small torchvision-style CNN: stem, one residual block, a depthwise-separable stage."""
    inits = []
    nodes = []

    inits.append(weight("conv1.weight", [16, 3, 3, 3]))
    inits += batch_norm_params("bn1", 16)
    nodes.append(
        helper.make_node(
            "Conv", ["input", "conv1.weight"], ["/conv1/Conv_output_0"], name="/conv1/Conv",
            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1,
        )
    )
    nodes.append(bn_node("bn1", "/conv1/Conv_output_0", "/bn1/BatchNormalization_output_0"))
    nodes.append(
        helper.make_node(
            "Relu", ["/bn1/BatchNormalization_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"
        )
    )

    # The residual block (torchvision's BasicBlock with 16 channels).
    p = "layer1.0"
    inits.append(weight(p + ".conv1.weight", [16, 16, 3, 3]))
    inits += batch_norm_params(p + ".bn1", 16)
    inits.append(weight(p + ".conv2.weight", [16, 16, 3, 3]))
    inits += batch_norm_params(p + ".bn2", 16)
    nodes.append(
        helper.make_node(
            "Conv", ["/relu/Relu_output_0", p + ".conv1.weight"], ["/layer1/conv1/Conv_output_0"],
            name="/" + p + "/conv1/Conv",
            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1,
        )
    )
    nodes.append(bn_node(p + ".bn1", "/layer1/conv1/Conv_output_0", "/layer1/bn1/BN_output_0"))
    nodes.append(
        helper.make_node(
            "Relu", ["/layer1/bn1/BN_output_0"], ["/layer1/relu/Relu_output_0"],
            name="/" + p + "/relu/Relu",
        )
    )
    nodes.append(
        helper.make_node(
            "Conv", ["/layer1/relu/Relu_output_0", p + ".conv2.weight"],
            ["/layer1/conv2/Conv_output_0"], name="/" + p + "/conv2/Conv",
            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1,
        )
    )
    nodes.append(bn_node(p + ".bn2", "/layer1/conv2/Conv_output_0", "/layer1/bn2/BN_output_0"))
    nodes.append(
        helper.make_node(
            "Add", ["/layer1/bn2/BN_output_0", "/relu/Relu_output_0"], ["/layer1/Add_output_0"],
            name="/" + p + "/Add",
        )
    )
    nodes.append(
        helper.make_node(
            "Relu", ["/layer1/Add_output_0"], ["/layer1/relu_1/Relu_output_0"],
            name="/" + p + "/relu_1/Relu",
        )
    )

    # Depthwise 3x3 stride 2, then pointwise 1x1 to 32 channels.
    inits.append(weight("dw.weight", [16, 1, 3, 3]))
    inits += batch_norm_params("dw_bn", 16)
    inits.append(weight("pw.weight", [32, 16, 1, 1]))
    inits.append(weight("pw.bias", [32], scale=0.1))
    nodes.append(
        helper.make_node(
            "Conv", ["/layer1/relu_1/Relu_output_0", "dw.weight"], ["/dw/Conv_output_0"],
            name="/dw/Conv",
            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], dilations=[1, 1], group=16,
        )
    )
    nodes.append(bn_node("dw_bn", "/dw/Conv_output_0", "/dw_bn/BN_output_0"))
    nodes.append(
        helper.make_node(
            "Relu", ["/dw_bn/BN_output_0"], ["/dw_relu/Relu_output_0"], name="/dw_relu/Relu"
        )
    )
    nodes.append(
        helper.make_node(
            "Conv", ["/dw_relu/Relu_output_0", "pw.weight", "pw.bias"], ["/pw/Conv_output_0"],
            name="/pw/Conv",
            kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1], group=1,
        )
    )
    nodes.append(
        helper.make_node("Relu", ["/pw/Conv_output_0"], ["/pw_relu/Relu_output_0"], name="/pw_relu/Relu")
    )

    # Head: pool, flatten, classifier.
    inits.append(weight("fc.weight", [10, 32]))
    inits.append(weight("fc.bias", [10], scale=0.1))
    nodes.append(
        helper.make_node(
            "MaxPool", ["/pw_relu/Relu_output_0"], ["/maxpool/MaxPool_output_0"],
            name="/maxpool/MaxPool", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0],
            ceil_mode=0,
        )
    )
    nodes.append(
        helper.make_node(
            "GlobalAveragePool", ["/maxpool/MaxPool_output_0"], ["/avgpool/GlobalAveragePool_output_0"],
            name="/avgpool/GlobalAveragePool",
        )
    )
    nodes.append(
        helper.make_node(
            "Flatten", ["/avgpool/GlobalAveragePool_output_0"], ["/Flatten_output_0"],
            name="/Flatten", axis=1,
        )
    )
    nodes.append(
        helper.make_node(
            "Gemm", ["/Flatten_output_0", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm",
            alpha=1.0, beta=1.0, transB=1,
        )
    )

    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    return make_model(graph, 17)


def transformer():
    """A one-layer pre-norm transformer encoder (d_model 64, 4 heads of 16, FFN 128)."""
    d, heads, head_dim, ffn = 64, 4, 16, 128
    inits = []
    nodes = []

    def const_node(name, value):
        """A Constant node as PyTorch exports them (a `value` tensor attribute)."""
        out = name + "_output_0"
        nodes.append(
            helper.make_node(
                "Constant", [], [out], name=name, value=numpy_helper.from_array(np.array(value))
            )
        )
        return out

    def linear(prefix, x, n_in, n_out):
        """MatMul by a [n_in, n_out] weight, then Add of the bias, as exported nn.Linear."""
        inits.append(weight(prefix + ".weight_t", [n_in, n_out], scale=1.0 / math.sqrt(n_in)))
        inits.append(weight(prefix + ".bias", [n_out], scale=0.1))
        mm = "/" + prefix + "/MatMul_output_0"
        out = "/" + prefix + "/Add_output_0"
        nodes.append(
            helper.make_node("MatMul", [x, prefix + ".weight_t"], [mm], name="/" + prefix + "/MatMul")
        )
        nodes.append(helper.make_node("Add", [mm, prefix + ".bias"], [out], name="/" + prefix + "/Add"))
        return out

    def layer_norm(prefix, x):
        inits.append(
            numpy_helper.from_array(
                (1.0 + 0.1 * RNG.standard_normal(d)).astype(np.float32), prefix + ".weight"
            )
        )
        inits.append(
            numpy_helper.from_array((0.1 * RNG.standard_normal(d)).astype(np.float32), prefix + ".bias")
        )
        out = "/" + prefix + "/LayerNormalization_output_0"
        nodes.append(
            helper.make_node(
                "LayerNormalization", [x, prefix + ".weight", prefix + ".bias"], [out],
                name="/" + prefix + "/LayerNormalization", axis=-1, epsilon=1e-5,
            )
        )
        return out

    def seq_len_shape(tag, tail):
        """Shape(x) -> Gather(1) -> Unsqueeze -> Concat([1, S] + tail): a target shape."""
        shape = "/" + tag + "/Shape_output_0"
        nodes.append(helper.make_node("Shape", ["x"], [shape], name="/" + tag + "/Shape"))
        index = const_node("/" + tag + "/Constant", np.array(1, dtype=np.int64))
        seq = "/" + tag + "/Gather_output_0"
        nodes.append(
            helper.make_node("Gather", [shape, index], [seq], name="/" + tag + "/Gather", axis=0)
        )
        axes = const_node("/" + tag + "/Constant_1", np.array([0], dtype=np.int64))
        seq1 = "/" + tag + "/Unsqueeze_output_0"
        nodes.append(helper.make_node("Unsqueeze", [seq, axes], [seq1], name="/" + tag + "/Unsqueeze"))
        one = const_node("/" + tag + "/Constant_2", np.array([1], dtype=np.int64))
        parts = [one, seq1]
        for k, v in enumerate(tail):
            parts.append(const_node("/" + tag + "/Constant_" + str(3 + k), np.array([v], dtype=np.int64)))
        out = "/" + tag + "/Concat_output_0"
        nodes.append(helper.make_node("Concat", parts, [out], name="/" + tag + "/Concat", axis=0))
        return out

    ln1 = layer_norm("ln1", "x")
    q = linear("attn.q", ln1, d, d)
    k = linear("attn.k", ln1, d, d)
    v = linear("attn.v", ln1, d, d)

    split_shape = seq_len_shape("attn/split", [heads, head_dim])
    heads_out = {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        r = "/attn/" + name + "/Reshape_output_0"
        nodes.append(
            helper.make_node("Reshape", [t, split_shape], [r], name="/attn/" + name + "/Reshape")
        )
        tr = "/attn/" + name + "/Transpose_output_0"
        nodes.append(
            helper.make_node("Transpose", [r], [tr], name="/attn/" + name + "/Transpose", perm=[0, 2, 1, 3])
        )
        heads_out[name] = tr
    kt = "/attn/k/Transpose_1_output_0"
    nodes.append(
        helper.make_node("Transpose", [heads_out["k"]], [kt], name="/attn/k/Transpose_1", perm=[0, 1, 3, 2])
    )
    scores = "/attn/MatMul_output_0"
    nodes.append(helper.make_node("MatMul", [heads_out["q"], kt], [scores], name="/attn/MatMul"))
    scale = const_node("/attn/Constant", np.array(math.sqrt(head_dim), dtype=np.float32))
    scaled = "/attn/Div_output_0"
    nodes.append(helper.make_node("Div", [scores, scale], [scaled], name="/attn/Div"))
    probs = "/attn/Softmax_output_0"
    nodes.append(helper.make_node("Softmax", [scaled], [probs], name="/attn/Softmax", axis=-1))
    ctx = "/attn/MatMul_1_output_0"
    nodes.append(helper.make_node("MatMul", [probs, heads_out["v"]], [ctx], name="/attn/MatMul_1"))
    back = "/attn/Transpose_output_0"
    nodes.append(helper.make_node("Transpose", [ctx], [back], name="/attn/Transpose", perm=[0, 2, 1, 3]))
    merge_shape = seq_len_shape("attn/merge", [d])
    merged = "/attn/Reshape_output_0"
    nodes.append(helper.make_node("Reshape", [back, merge_shape], [merged], name="/attn/Reshape"))
    attn = linear("attn.out_proj", merged, d, d)
    res1 = "/Add_output_0"
    nodes.append(helper.make_node("Add", ["x", attn], [res1], name="/Add"))

    ln2 = layer_norm("ln2", res1)
    h = linear("ffn.fc1", ln2, d, ffn)
    g = "/ffn/Gelu_output_0"
    nodes.append(helper.make_node("Gelu", [h], [g], name="/ffn/Gelu", approximate="none"))
    f = linear("ffn.fc2", g, ffn, d)
    nodes.append(helper.make_node("Add", [res1, f], ["y"], name="/Add_1"))

    graph = helper.make_graph(
        nodes,
        "transformer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", d])],
        initializer=inits,
    )
    return make_model(graph, 20)


def tiny_add():
    """Two [2,3] inputs added: the smallest useful model, for truncation and corruption tests."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"], name="add")],
        "tiny_add",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])],
    )
    return make_model(graph, 17)


def tiny_typed():
    """Initializers in every supported type, written both in raw_data and in the typed fields
    (float_data, int32_data for f16/i8/i16/u8/bool, int64_data, double_data) as `onnx.helper`
    writes them, plus a Constant node with `value_floats`, an unnamed node and an optional input
    left empty, so the importer is checked against the reference implementation's encoding."""
    inits = [
        helper.make_tensor("f32_typed", TensorProto.FLOAT, [2, 2], [1.5, -2.0, 0.25, 8.0]),
        helper.make_tensor(
            "f32_raw", TensorProto.FLOAT, [2, 2],
            np.array([1.5, -2.0, 0.25, 8.0], dtype=np.float32).tobytes(), raw=True,
        ),
        helper.make_tensor(
            "f16_typed", TensorProto.FLOAT16, [3], np.array([1.0, -0.5, 65504.0], dtype=np.float16)
        ),
        helper.make_tensor("i8_typed", TensorProto.INT8, [3], [-128, 0, 127]),
        helper.make_tensor("u8_typed", TensorProto.UINT8, [3], [0, 1, 255]),
        helper.make_tensor("i16_typed", TensorProto.INT16, [2], [-32768, 32767]),
        helper.make_tensor("bool_typed", TensorProto.BOOL, [3], [True, False, True]),
        helper.make_tensor("i32_typed", TensorProto.INT32, [2], [-7, 2147483647]),
        helper.make_tensor("i64_typed", TensorProto.INT64, [2], [-9, 9007199254740993]),
        helper.make_tensor("f64_typed", TensorProto.DOUBLE, [2], [0.1, -3.0]),
        helper.make_tensor("scalar_i64", TensorProto.INT64, [], [42]),
    ]
    nodes = [
        helper.make_node("Constant", [], ["c"], value_floats=[0.5, 1.0, 2.0, 4.0]),
        helper.make_node("Add", ["x", "c"], ["sum"]),
        helper.make_node("Clip", ["sum", "", "f32_scalar_max"], ["clipped"], name="clip"),
        helper.make_node("Add", ["clipped", "f32_typed"], ["out0"]),
        helper.make_node("Add", ["out0", "f32_raw"], ["out"], name="add"),
        helper.make_node("Add", ["out", "f32_raw"], ["out_again"], name="add"),
    ]
    inits.append(helper.make_tensor("f32_scalar_max", TensorProto.FLOAT, [], [6.0]))
    graph = helper.make_graph(
        nodes,
        "tiny_typed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("out_again", TensorProto.FLOAT, [2, 4]),
        ],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 17)]
    model = helper.make_model(
        graph, opset_imports=opsets, producer_name="gearsim-make-models",
        ir_version=helper.find_min_ir_version_for(opsets),
    )
    # Node names repeat on purpose (the importer makes them unique), which the full checker
    # accepts; the graph is otherwise valid.
    onnx.checker.check_model(model)
    return model


def gear_batch():
    """The dynamic-batch golden model: Conv-Relu, PyTorch's flatten (Shape -> Gather ->
    Unsqueeze -> Concat -> Reshape), MatMul + Add. Input `x` [N,4,8,8], output `y` [N,10]."""
    inits = [
        weight("conv.weight", [8, 4, 3, 3]),
        weight("conv.bias", [8], 0.1),
        weight("fc.weight", [512, 10]),
        weight("fc.bias", [10], 0.1),
        numpy_helper.from_array(np.array(0, np.int64), "/Constant_output_0"),
        numpy_helper.from_array(np.array([0], np.int64), "/Constant_1_output_0"),
        numpy_helper.from_array(np.array([-1], np.int64), "/Constant_2_output_0"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"],
                         name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["/conv/Conv_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"),
        helper.make_node("Shape", ["/relu/Relu_output_0"], ["/Shape_output_0"], name="/Shape"),
        helper.make_node("Gather", ["/Shape_output_0", "/Constant_output_0"], ["/Gather_output_0"],
                         name="/Gather", axis=0),
        helper.make_node("Unsqueeze", ["/Gather_output_0", "/Constant_1_output_0"],
                         ["/Unsqueeze_output_0"], name="/Unsqueeze"),
        helper.make_node("Concat", ["/Unsqueeze_output_0", "/Constant_2_output_0"],
                         ["/Concat_output_0"], name="/Concat", axis=0),
        helper.make_node("Reshape", ["/relu/Relu_output_0", "/Concat_output_0"],
                         ["/Reshape_output_0"], name="/Reshape"),
        helper.make_node("MatMul", ["/Reshape_output_0", "fc.weight"], ["/fc/MatMul_output_0"],
                         name="/fc/MatMul"),
        helper.make_node("Add", ["/fc/MatMul_output_0", "fc.bias"], ["y"], name="/fc/Add"),
    ]
    graph = helper.make_graph(
        nodes, "gear_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return make_model(graph, 17)


def gear_image():
    """The dynamic-image-size golden model: Conv (stride 2) - Relu - GlobalAveragePool - Flatten.
    Input `img` [1,3,H,W]; outputs `feat` [1,4] and `act` [1,4,H/2,W/2]."""
    inits = [weight("conv.weight", [4, 3, 3, 3]), weight("conv.bias", [4], 0.1)]
    nodes = [
        helper.make_node("Conv", ["img", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"],
                         name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["/conv/Conv_output_0"], ["act"], name="/relu/Relu"),
        helper.make_node("GlobalAveragePool", ["act"], ["/pool/GlobalAveragePool_output_0"],
                         name="/pool/GlobalAveragePool"),
        helper.make_node("Flatten", ["/pool/GlobalAveragePool_output_0"], ["feat"], name="/Flatten",
                         axis=1),
    ]
    graph = helper.make_graph(
        nodes, "gear_image",
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("act", TensorProto.FLOAT, [1, 4, "H2", "W2"])],
        inits,
    )
    return make_model(graph, 17)


def gear_dims():
    """The seed example of --dynamic_dims: inputs data [1,1,40,T], label [1,L] and mask [M,K].
    Outputs `feat` = Transpose(Relu(data * 2)) [1,1,T,40], `mask_sum` = ReduceSum(mask, axis 1)
    [M], and `label` itself (a direct output: graph input straight to graph output)."""
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    nodes = [
        helper.make_node("Mul", ["data", "two"], ["/Mul_output_0"], name="/Mul"),
        helper.make_node("Relu", ["/Mul_output_0"], ["/Relu_output_0"], name="/Relu"),
        helper.make_node("Transpose", ["/Relu_output_0"], ["feat"], name="/Transpose",
                         perm=[0, 1, 3, 2]),
        helper.make_node("ReduceSum", ["mask", "axes"], ["mask_sum"], name="/ReduceSum",
                         keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "gear_dims",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 1, 40, "T"]),
         helper.make_tensor_value_info("label", TensorProto.INT32, [1, "L"]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["M", "K"])],
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 1, "T", 40]),
         helper.make_tensor_value_info("mask_sum", TensorProto.FLOAT, ["M"]),
         helper.make_tensor_value_info("label", TensorProto.INT32, [1, "L"])],
        inits,
    )
    return make_model(graph, 17)


def aicpu_ops():
    """Operators that run on the AI CPU, batch -1: a GatherElements whose indices are computed
    at run time (an AI core Cast of an int64 input), Casts through float64 and bfloat16, a Mod of
    the indices, added back on the AI core. No weights."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["k"], ["idx"], name="idx", to=TensorProto.INT32),
            helper.make_node("GatherElements", ["x", "idx"], ["g"], name="gather", axis=1),
            helper.make_node("Cast", ["g"], ["g64"], name="to_f64", to=TensorProto.DOUBLE),
            helper.make_node("Cast", ["g64"], ["gbf"], name="to_bf16", to=TensorProto.BFLOAT16),
            helper.make_node("Cast", ["gbf"], ["gf"], name="to_f32", to=TensorProto.FLOAT),
            helper.make_node("Constant", [], ["three"], name="three",
                             value=helper.make_tensor("three", TensorProto.INT32, [], [3])),
            helper.make_node("Mod", ["idx", "three"], ["m"], name="mod"),
            helper.make_node("Cast", ["m"], ["mf"], name="mod_f32", to=TensorProto.FLOAT),
            helper.make_node("Add", ["gf", "mf"], ["y"], name="add"),
        ],
        "aicpu_ops",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6]),
            helper.make_tensor_value_info("k", TensorProto.INT64, ["N", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return make_model(graph, 17)


def run_check(model, feeds):
    """Runs the model with the reference evaluator, so a model that does not compute fails here."""
    outputs = ReferenceEvaluator(model).run(None, feeds)
    for out in outputs:
        if not np.all(np.isfinite(out)):
            sys.exit("model produced non-finite values")
    return outputs


def save(model, name):
    path = os.path.join(HERE, name)
    data = model.SerializeToString(deterministic=True)
    with open(path, "wb") as f:
        f.write(data)
    print(f"{name}: {len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers, "
          f"{len(data)} bytes")


def seed_inputs():
    """Inputs of `gear_dims.onnx` at its gear 40,40,2,2 (`inputs/seed_*.npy`), for the README's
    `gearsim run` example; their own seed, so they do not move the models' weights."""
    rng = np.random.default_rng(7)
    d = os.path.join(HERE, "inputs")
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "seed_data.npy"), rng.standard_normal((1, 1, 40, 40)).astype(np.float32))
    np.save(os.path.join(d, "seed_label.npy"), np.arange(40, dtype=np.int32).reshape(1, 40))
    np.save(os.path.join(d, "seed_mask.npy"), rng.standard_normal((2, 2)).astype(np.float32))


def main():
    m = cnn()
    out = run_check(m, {"input": RNG.standard_normal((2, 3, 32, 32)).astype(np.float32)})
    assert out[0].shape == (2, 10), out[0].shape
    save(m, "cnn.onnx")

    m = transformer()
    out = run_check(m, {"x": RNG.standard_normal((1, 7, 64)).astype(np.float32)})
    assert out[0].shape == (1, 7, 64), out[0].shape
    save(m, "transformer.onnx")

    m = tiny_add()
    run_check(m, {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)})
    save(m, "tiny_add.onnx")

    m = tiny_typed()
    save(m, "tiny_typed.onnx")

    # The golden-dump models (made after the others so their weights are unchanged).
    m = gear_batch()
    out = run_check(m, {"x": RNG.standard_normal((2, 4, 8, 8)).astype(np.float32)})
    assert out[0].shape == (2, 10), out[0].shape
    save(m, "gear_batch.onnx")

    m = gear_image()
    out = run_check(m, {"img": RNG.standard_normal((1, 3, 12, 20)).astype(np.float32)})
    assert out[0].shape == (1, 4) and out[1].shape == (1, 4, 6, 10), [o.shape for o in out]
    save(m, "gear_image.onnx")

    m = gear_dims()
    out = run_check(m, {
        "data": RNG.standard_normal((1, 1, 40, 20)).astype(np.float32),
        "label": np.arange(20, dtype=np.int32).reshape(1, 20),
        "mask": RNG.standard_normal((2, 3)).astype(np.float32),
    })
    assert out[0].shape == (1, 1, 20, 40) and out[1].shape == (2,), [o.shape for o in out]
    save(m, "gear_dims.onnx")

    m = aicpu_ops()
    out = run_check(m, {
        "x": RNG.standard_normal((2, 6)).astype(np.float32),
        "k": np.array([[0, 5, 2, 1], [3, 3, 4, 0]], np.int64),
    })
    assert out[0].shape == (2, 4), out[0].shape
    save(m, "aicpu_ops.onnx")

    seed_inputs()


if __name__ == "__main__":
    main()

"""Writes small.onnx, the ONNX graph `tensortune extract`'s test reads (python3 make_small_onnx.py;
needs the `onnx` package). No shape inference is run: the extractor must propagate shapes itself.

x [N, 3, 8, 8] -> Conv 3x3 pad 1 (4 ch) -> Relu -> Conv 1x1 stride 2 (4 ch) -> grouped Conv (2 groups,
skipped) -> GlobalAveragePool -> Flatten -> Gemm transB (10, bias) -> Relu -> MatMul [10, 6] -> Add
bias -> Reshape [-1, 2, 3] -> MatMul with its Transpose -> y [N, 2, 2]; plus a second Gemm of the same
shape as the first (another entry: its epilogue differs).
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)


def w(name, *shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


inits = [
    w("w1", 4, 3, 3, 3),
    w("w2", 4, 4, 1, 1),
    w("wg", 4, 2, 3, 3),
    w("w3", 10, 4),
    w("b3", 10),
    w("w3b", 10, 4),
    w("b3b", 10),
    w("w4", 10, 6),
    w("b4", 6),
    numpy_helper.from_array(np.array([-1, 2, 3], dtype=np.int64), "shape"),
]
nodes = [
    helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
    helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
    helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", strides=[2, 2]),
    helper.make_node("Conv", ["c2", "wg"], ["cg"], name="grouped", group=2, pads=[1, 1, 1, 1]),
    helper.make_node("GlobalAveragePool", ["cg"], ["p"], name="pool"),
    helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
    helper.make_node("Gemm", ["f", "w3", "b3"], ["g"], name="fc", transB=1),
    helper.make_node("Relu", ["g"], ["gr"], name="relu2"),
    helper.make_node("Gemm", ["f", "w3b", "b3b"], ["g2"], name="fc_twin", transB=1),
    helper.make_node("Add", ["gr", "g2"], ["s"], name="sum"),
    helper.make_node("MatMul", ["s", "w4"], ["m"], name="proj"),
    helper.make_node("Add", ["m", "b4"], ["mb"], name="proj_bias"),
    helper.make_node("Reshape", ["mb", "shape"], ["q"], name="reshape"),
    helper.make_node("Transpose", ["q"], ["qt"], name="transpose", perm=[0, 2, 1]),
    helper.make_node("MatMul", ["q", "qt"], ["y"], name="scores"),
]
graph = helper.make_graph(
    nodes,
    "small",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 2])],
    inits,
)
model = helper.make_model(graph, producer_name="tensortune-test", opset_imports=[helper.make_opsetid("", 17)])
onnx.checker.check_model(model)
onnx.save(model, os.path.join(os.path.dirname(os.path.abspath(__file__)), "small.onnx"))

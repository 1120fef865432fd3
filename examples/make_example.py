"""Build examples/tiny_cnn.onnx: a small CNN made with onnx.helper (a few KB).

    python examples/make_example.py

Conv -> BatchNormalization -> Relu -> MaxPool -> Flatten -> Gemm -> Softmax, with
deterministic weights, so `glowgen run examples/tiny_cnn.onnx` has something real to do.
"""
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(42)

    def init(name, *shape, scale=0.1):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("conv_w", 4, 3, 3, 3), init("conv_b", 4),
        numpy_helper.from_array((rng.random(4) + 0.5).astype(np.float32), "bn_scale"),
        init("bn_bias", 4), init("bn_mean", 4),
        numpy_helper.from_array((rng.random(4) + 0.5).astype(np.float32), "bn_var"),
        init("fc_w", 10, 4 * 4 * 4), init("fc_b", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["conv", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                         ["bn"], epsilon=1e-5, name="bn"),
        helper.make_node("Relu", ["bn"], ["relu"], name="relu"),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="glowgen examples/make_example.py")
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = Path(__file__).with_name("tiny_cnn.onnx")
    onnx.save(build(), out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")

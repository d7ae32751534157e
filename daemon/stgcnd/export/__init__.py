"""PyTorch -> ONNX export and its validation."""

# Every exported graph's interface: input (N, 3, T, V, M) float32, output logits; opset 17.
INPUT_NAME = "input"
OUTPUT_NAME = "output"
OPSET = 17

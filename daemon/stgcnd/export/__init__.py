"""PyTorch -> ONNX export and its validation."""

"""The engine store: exported ONNX models and built artefacts per (backend, precision, device).

Nothing here imports torch at module level: the TensorRT path must be able to reuse a built
engine without it.
"""

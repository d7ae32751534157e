"""The engine store: exported ONNX models and built artefacts per (backend, precision, device).

Modules: options (BuildOptions), store (EngineStore, Artifact), keys (cache keys and why they
differ), lock (flock-based build locks), device (GPU / Jetson identity), calibration (INT8
calibration windows), quantize (Q/DQ INT8 ONNX), validate (artefact vs the PyTorch reference),
builders/ (one per backend). Nothing here imports torch at module level: the TensorRT path must
be able to reuse a built engine without it.
"""

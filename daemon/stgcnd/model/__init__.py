"""The ST-GCN network, its graphs, checkpoints and the demo model.

Importing the package does not import torch: `reference.load_for_inference` gives a PyTorch
LoadedModel where torch is installed, the demo model's numpy stand-in where it is not.
"""

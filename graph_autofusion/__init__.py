"""graph-autofusion: an automatic operator-fusion compiler for ONNX and PyTorch models."""

__version__ = "0.1.0"

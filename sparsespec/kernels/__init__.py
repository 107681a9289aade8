"""Compiled kernels that build on first use and fall back to PyTorch operations where they cannot."""

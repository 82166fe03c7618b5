"""Kernel tests: Triton kernels vs torch references (interpreted on CPU), roofline arithmetic."""

"""FlashAttention-2 in Triton: tile helpers (`tiles`), configs (`configs`), launch plumbing (`launcher`), the
forward (`fwd`) and backward (`bwd`) kernels, and the autograd Function (`function`)."""

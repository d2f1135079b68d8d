"""FlashAttention in Gluon for Hopper: the FA3-style forward (`fwd`), the fused two-warp-group backward (`bwd`)
and what they share (`common`)."""

"""Client-side computation: local updates and DP-SGD gradients (per-example clipping, ghost clipping, noise)."""

"""Names of the optional batch features that a model reads beside seqio's EncDecFeatureConverter features.

SOFT_TARGET_TOKENS int32[b, target_length, K] / SOFT_TARGET_MASS float32[b, target_length, K]: each target
position's soft target, its support tokens and their probabilities (SToICaL's y(r, t); `gr_jax.losses`).
"""
import numpy as np

SOFT_TARGET_TOKENS = "decoder_soft_target_tokens"
SOFT_TARGET_MASS = "decoder_soft_target_mass"


def decoder_inputs(targets: np.ndarray) -> np.ndarray:
    """The teacher-forced decoder inputs of targets int[b, length]: shifted right by one, starting with 0 (the decoder
    start, PAD), as seqio's EncDecFeatureConverter makes them."""
    return np.pad(targets[:, :-1], ((0, 0), (1, 0)))

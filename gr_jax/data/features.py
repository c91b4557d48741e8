"""Names of the optional batch features that a model reads beside seqio's EncDecFeatureConverter features.

SOFT_TARGET_TOKENS int32[b, target_length, K] / SOFT_TARGET_MASS float32[b, target_length, K]: each target
position's soft target, its support tokens and their probabilities (SToICaL's y(r, t); `gr_jax.losses`).
"""
SOFT_TARGET_TOKENS = "decoder_soft_target_tokens"
SOFT_TARGET_MASS = "decoder_soft_target_mass"

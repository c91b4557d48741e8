"""gr_jax: generative retrieval (DSI-style) with T5.1.1 in JAX/Flax, in the style of t5x."""

__version__ = "0.1.0"

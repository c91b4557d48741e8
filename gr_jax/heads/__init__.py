"""Output heads of the T5.1.1 network, one module each (see `base`): 'standard' (T5.1.1's projection over the
vocabulary), 'atomic' (DSI's one column per document) and 'pawa' (NCI's prefix-aware weight-adaptive decoder).

A head is chosen and set in gin as its own configurable (`HEAD = @pawa.PawaHead()`, gin_configs/decoders/*.gin) and
passed where the model is built; a new head is a module of its own, anywhere, that nothing else names.
"""
from gr_jax.heads.atomic import AtomicHead
from gr_jax.heads.base import HeadLayer, OutputHead, OverDocidTokens, masked_logits
from gr_jax.heads.pawa import PawaHead
from gr_jax.heads.standard import StandardHead

__all__ = ["AtomicHead", "HeadLayer", "OutputHead", "OverDocidTokens", "PawaHead", "StandardHead", "masked_logits"]

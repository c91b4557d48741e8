"""Output heads of the T5.1.1 network, one module each, chosen by `T5Config.decoder_head` (see `base`).

Importing this package registers every module in it: 'standard' (T5.1.1's projection over the vocabulary),
'atomic' (DSI's one column per document) and 'pawa' (NCI's prefix-aware weight-adaptive decoder).
"""
import importlib
import pkgutil

from gr_jax.heads.base import HEADS, OutputHead, get_head, masked_logits, register_head

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

from gr_jax.heads.atomic import AtomicHead  # noqa: E402
from gr_jax.heads.pawa import PawaHead  # noqa: E402
from gr_jax.heads.standard import StandardHead  # noqa: E402



def fresh_param_patterns() -> tuple[str, ...]:
    """Path patterns (full match) of the parameters of every registered head that no pretrained T5 has."""
    return tuple(pattern for head in HEADS.values() for pattern in head.fresh_param_patterns)


__all__ = ["HEADS", "AtomicHead", "OutputHead", "PawaHead", "StandardHead", "fresh_param_patterns", "get_head",
           "masked_logits", "register_head"]

"""The decoder-only family (`gr_jax.family`): a Llama / Mistral / Qwen network trained on the generative family's
seqio tasks, every table row and docid scheme included, and evaluated through the same retriever, trie and metrics.

Its run is the generative `Built`: only the model differs (`DecoderOnlyModel`: the query block, then the docid
tokens). gin: `gin_configs/decoder_only/train.gin` (with a size file, e.g. `decoder_only/micro.gin`).
"""
from __future__ import annotations

import dataclasses

from gr_jax.decoder_only.model import DecoderOnlyModel
from gr_jax.decoder_only.network import DecoderOnlyConfig
from gr_jax.experiment import Built, GenerativeFamily
from gr_jax.run_dir import RunDir
from gr_jax.vocabulary import load_vocabulary, vocabulary_file


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderOnlyExperiment(GenerativeFamily):
    """network_config: the network (vocab_size None: the run's pieces and docid tokens, rounded up to a multiple of
    128). init_checkpoint: a gr_jax run dir of this family to start from."""
    network_config: DecoderOnlyConfig

    def __post_init__(self):
        if self.init_checkpoint and not RunDir.of(self.init_checkpoint).is_run():
            raise ValueError(f"init_checkpoint {self.init_checkpoint}: a decoder-only retrieval run starts from a "
                             "gr_jax run dir; starting it from a Hugging Face checkpoint (docid tokens appended to "
                             "its vocabulary) is not implemented yet (docs/decoder_only.md)")

    def build(self, *, keep_checkpoints: int = 3) -> Built:
        """Reads the vocabulary and docid space, registers the tasks and builds the model for them (no parameter
        is allocated)."""
        vocabulary = load_vocabulary(vocabulary_file(self.dataset))
        docid_space = self.dataset.docid_space()
        if docid_space is None:
            raise ValueError(f"{self.dataset.mixture_name!r} has no docids: the decoder-only family retrieves")
        self.dataset.register(docid_space)
        config = self.network_config
        needed = docid_space.model_vocab_size
        if config.vocab_size is None:
            config = config.with_vocab_size(needed)
        elif config.vocab_size < needed:
            raise ValueError(f"DecoderOnlyConfig.vocab_size={config.vocab_size} is smaller than the {needed} token "
                             "ids the vocabulary and docids need")
        model = DecoderOnlyModel(config=config, loss=self.loss)
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints)
        return Built(experiment=self, vocabulary=vocabulary, docid_space=docid_space, model=model, mesh=mesh,
                     trainer=trainer, checkpointer=checkpointer)

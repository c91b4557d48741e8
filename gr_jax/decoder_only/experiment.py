"""The decoder-only family (`gr_jax.family`): a Llama / Mistral / Qwen network trained on the generative family's
seqio tasks, every table row and docid scheme included, and evaluated through the same retriever, trie and metrics.

Its run is the generative `Built`: only the model differs (`DecoderOnlyModel`: the query block, then the docid
tokens). gin: `gin_configs/decoder_only/train.gin` (with a size file, e.g. `decoder_only/micro.gin`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from gr_jax.decoder_only.model import DecoderOnlyModel
from gr_jax.decoder_only.network import DecoderOnlyConfig
from gr_jax.experiment import Built, GenerativeFamily
from gr_jax.run_dir import RunDir
from gr_jax.vocabulary import load_vocabulary, vocabulary_file


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """Text around each query, tokenised by the run's vocabulary once: the model sees [prefix, query, suffix] and
    then the docid tokens, e.g. prefix 'query:' and suffix 'document id:' (an instruction-tuned checkpoint's
    wording). Empty strings: the query alone."""
    prefix: str = ""
    suffix: str = ""

    def token_ids(self, vocabulary: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prefix ids, suffix ids) in `vocabulary`; a piece that decodes to nothing is an error."""
        ids = []
        for name, text in (("prefix", self.prefix), ("suffix", self.suffix)):
            encoded = tuple(int(i) for i in vocabulary.encode(text)) if text else ()
            if text and not encoded:
                raise ValueError(f"PromptTemplate.{name}={text!r} is no token of the run's vocabulary")
            ids.append(encoded)
        return ids[0], ids[1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderOnlyExperiment(GenerativeFamily):
    """network_config: the network (vocab_size None: the run's pieces and docid tokens, rounded up to a multiple of
    128). prompt: the template around each query. init_checkpoint: a gr_jax run dir of this family to start
    from."""
    network_config: DecoderOnlyConfig
    prompt: PromptTemplate = PromptTemplate()

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
        prefix, suffix = self.prompt.token_ids(vocabulary)
        model = DecoderOnlyModel(config=config, loss=self.loss, prompt_prefix=prefix, prompt_suffix=suffix)
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints,
                                                          frozen=model.frozen_parameters)
        return Built(experiment=self, vocabulary=vocabulary, docid_space=docid_space, model=model, mesh=mesh,
                     trainer=trainer, checkpointer=checkpointer)

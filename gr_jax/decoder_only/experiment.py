"""The decoder-only family (`gr_jax.family`): a Llama / Mistral / Qwen network trained on the generative family's
seqio tasks, every table row and docid scheme included, and evaluated through the same retriever, trie and metrics.

Its run is the generative `Built`: only the model differs (`DecoderOnlyModel`: the query block, then the docid
tokens). gin: `gin_configs/decoder_only/train.gin` (with a size file, e.g. `decoder_only/micro.gin`).
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Optional

from gr_jax.decoder_only.model import DecoderOnlyModel
from gr_jax.decoder_only.network import DecoderOnlyConfig
from gr_jax.experiment import Built, GenerativeFamily
from gr_jax.run_dir import hugging_face_checkpoint
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
    from, or a Hugging Face Llama / Mistral / Qwen checkpoint dir (`decoder_only/from_checkpoint.gin`: the network
    from its config.json, the queries and naive docids tokenised by its tokenizer.json, its token rows kept after
    two new ones for PAD and EOS and the docid tokens' rows appended fresh)."""
    network_config: DecoderOnlyConfig
    prompt: PromptTemplate = PromptTemplate()

    def hugging_face_start(self) -> Optional[pathlib.Path]:
        """The Hugging Face checkpoint the run's parameters come from: `init_checkpoint`, or the one the run it
        names started from (`run_dir.hugging_face_checkpoint`); None for a start from a seed, or from a run that
        does not record its own start."""
        if self.init_checkpoint is None:
            return None
        try:
            return hugging_face_checkpoint(self.init_checkpoint).resolve()
        except (ValueError, FileNotFoundError):
            return None

    def build(self, *, keep_checkpoints: int = 3) -> Built:
        """Reads the vocabulary and docid space, registers the tasks and builds the model for them (no parameter
        is allocated)."""
        path = vocabulary_file(self.dataset)
        vocabulary = load_vocabulary(path)
        token_offset = 0
        checkpoint = self.hugging_face_start()
        if checkpoint is not None:
            # TensorFlow (seqio): only for runs that tokenise with a checkpoint's tokenizer; host-made data (ranked
            # lists) trains this family on a JAX-only host otherwise.
            from gr_jax.data.hf_tokenizer import TOKENIZER_FILENAME, HFTokenizerVocabulary
            if not (isinstance(vocabulary, HFTokenizerVocabulary) and vocabulary.path.parent == checkpoint):
                raise ValueError(f"init_checkpoint {self.init_checkpoint} starts from the Hugging Face checkpoint "
                                 f"{checkpoint}: the run tokenises with its {TOKENIZER_FILENAME}, not {path} "
                                 "(DatasetConfig."
                                 "vocabulary_path; decoder_only/from_checkpoint.gin sets both)")
            token_offset = vocabulary.id_offset
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
        model = DecoderOnlyModel(config=config, loss=self.loss, prompt_prefix=prefix, prompt_suffix=suffix,
                                 token_offset=token_offset)
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints,
                                                          frozen=model.frozen_parameters)
        return Built(experiment=self, vocabulary=vocabulary, docid_space=docid_space, model=model, mesh=mesh,
                     trainer=trainer, checkpointer=checkpointer)

"""Decoder-only language models (Llama-2/3, Mistral, Qwen2, Qwen3) as a model family: the network
(`decoder_only.network`) and Hugging Face checkpoints read into it (`decoder_only.pretrained`)."""

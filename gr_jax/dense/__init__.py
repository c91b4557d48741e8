"""Dense retrieval beside generative retrieval: dual encoders (MiniLM or T5.1.1-encoder towers, single-vector or
MaxSim), trained with the project's trainer on sampled softmax over in-batch and hard negatives, and searched
through a faiss corpus index (`gr_jax.retrievers.dense`). gin: `gin_configs/dense/`."""

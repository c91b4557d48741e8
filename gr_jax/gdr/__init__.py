"""Generative dense retrieval (GDR-style, Yuan et al. 2024): a generative model recalls document clusters by their
ids, dense vectors rank the documents inside them, and new documents join a cluster without training. gin:
`gin_configs/gdr/`; choices and measurements: docs/gdr.md."""

"""Scaling laws of generative retrieval (Cai et al. 2025): the CGL metric, law fits and their plots."""

"""Rank-aware generative retrieval (SToICaL, Rozonoyer et al.): item weights, trie-marginalised targets."""

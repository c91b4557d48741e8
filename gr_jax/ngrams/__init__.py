"""n-gram (span) identifiers, MINDER-style: span selection, the span index and its retriever."""

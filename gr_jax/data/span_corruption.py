"""Span corruption's arithmetic (T5's continued-pretraining objective): window lengths and sentinel counts.

Plain Python, no TensorFlow: the sentinel ids a docid space reserves after the vocabulary's pieces depend on it,
and host-made datasets build docid spaces on hosts without TensorFlow. The corruption itself is
`gr_jax.data.preprocessors.span_corruption`.
"""
from __future__ import annotations


def span_corruption_counts(length: int, *, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a window of `length` tokens: at least one of each, at most all but one
    token noise (all of a one-token window), and never more spans than noise or non-noise tokens allow."""
    num_noise = min(max(round(length * noise_density), 1), max(length - 1, 1))
    num_spans = min(max(round(num_noise / mean_noise_span_length), 1), num_noise, max(length - num_noise, 1))
    return num_noise, num_spans


def span_corruption_window(*, input_length: int, target_length: int, noise_density: float = 0.15,
                           mean_noise_span_length: float = 3.0) -> int:
    """The longest window of raw tokens whose corrupted inputs and targets (EOS included) both fit.

    inputs: the window's non-noise tokens plus one sentinel per span plus EOS; targets: one sentinel per span
    plus the noise tokens plus EOS, with room for one more span than `span_corruption_counts` (the rotation).
    E.g. inputs 64, targets 16 at density 0.15 and mean span 3 -> 69 tokens (10 noise tokens in 3 or 4 spans:
    inputs <= 64, targets <= 15).
    """
    for name, value in (("input_length", input_length), ("target_length", target_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ValueError(f"{name} must be an integer >= 2 (a token and EOS), got {value!r}")
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
    if not mean_noise_span_length >= 1.0:
        raise ValueError(f"mean_noise_span_length must be >= 1, got {mean_noise_span_length}")
    best = 0
    for length in range(1, 4 * (input_length + target_length)):
        num_noise, num_spans = span_corruption_counts(length, noise_density=noise_density,
                                                      mean_noise_span_length=mean_noise_span_length)
        # + 1 span: the random rotation may split one span in two (see `span_corruption`).
        if length - num_noise + num_spans + 2 <= input_length and num_noise + num_spans + 2 <= target_length:
            best = length
    if best == 0:
        raise ValueError(f"no window fits inputs {input_length} and targets {target_length} tokens")
    return best


def num_sentinels(*, input_length: int, target_length: int, noise_density: float = 0.15,
                  mean_noise_span_length: float = 3.0) -> int:
    """Sentinel ids a span-corrupted example of these lengths may use: one more than a full window's spans."""
    window = span_corruption_window(input_length=input_length, target_length=target_length,
                                    noise_density=noise_density, mean_noise_span_length=mean_noise_span_length)
    return span_corruption_counts(window, noise_density=noise_density,
                                  mean_noise_span_length=mean_noise_span_length)[1] + 1

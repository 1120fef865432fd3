"""Recurrent layers (LSTM, GRU, RNN): result shapes, activations, sequence-length masks.

Each function marked @helper is callable from the specs, where specs/helpers.glowdef declares
it with its parameters."""
from __future__ import annotations

from .registry import helper


@helper
def rnn_sequence_shape(x_shape, layout, directions, hidden):
    """Y of LSTM/GRU/RNN: [S, D, B, H], or [B, S, D, H] with layout 1."""
    seq, batch = (x_shape[0], x_shape[1]) if layout == 0 else (x_shape[1], x_shape[0])
    return (seq, directions, batch, hidden) if layout == 0 else (batch, seq, directions, hidden)


@helper
def rnn_state_shape(x_shape, layout, directions, hidden):
    """Y_h / Y_c of LSTM/GRU/RNN: [D, B, H], or [B, D, H] with layout 1."""
    batch = x_shape[1] if layout == 0 else x_shape[0]
    return (directions, batch, hidden) if layout == 0 else (batch, directions, hidden)


@helper
def rnn_activations():
    """The activations of recurrent layers the lowering can build (ONNX names)."""
    return ("Sigmoid", "Tanh", "Relu", "LeakyRelu", "HardSigmoid", "Elu", "Softplus", "ThresholdedRelu")


@helper
def all_in(values, allowed):
    return all(v in tuple(allowed) for v in values)


@helper
def rnn_step_masked(seq_lens, t):
    """Whether step t lies beyond some batch entry's sequence length."""
    return any(t >= int(n) for n in seq_lens)


@helper
def rnn_step_mask(seq_lens, t):
    """[B, 1] booleans: which batch entries step t is within (their sequence length)."""
    return tuple((t < int(n),) for n in seq_lens)

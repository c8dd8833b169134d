"""Activation checkpointing: recompute each layer's activations in backward, keep only its input.

An opt-in memory path beside the reference model of nmt/model.py (fairseq's
--checkpoint-activations): `train.checkpoint_activations=true` makes nmt/commands/train.py call
`checkpoint_layers(model)`, which trades about one more forward pass per update for the
activations of every encoder and decoder layer, so that a big model takes larger per-GPU
batches. The model's weights, state dict and results are unchanged (dropout draws the same
masks again in the recomputation: torch.utils.checkpoint restores the random state);
tests/unit/test_activation_checkpointing.py checks the gradients against the reference.
"""

from __future__ import annotations

import types

from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_layers(model: nn.Module) -> nn.Module:
    """Make every layer of `model.encoder` and `model.decoder` recompute its activations in
    backward (in place; returns the model). Each layer object gets `checkpointed_forward`
    bound to it: other models, copies made before this call and the state dict are untouched;
    a copy made after it (copy.deepcopy) binds the function to its own layers. One function
    for every layer and model, so that torch.compile's guards see the same one in every run
    (a closure or partial per layer would be new to them each time)."""
    for layer in [*model.encoder, *model.decoder]:
        layer.forward = types.MethodType(checkpointed_forward, layer)
    return model


def checkpointed_forward(layer: nn.Module, *args, **kwargs):
    """The layer's own class forward, its activations recomputed in backward."""
    return checkpoint(type(layer).forward, layer, *args, use_reentrant=False, **kwargs)

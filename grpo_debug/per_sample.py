"""Exact per-sample gradients from ONE backward pass, with module hooks.

When the loss is a sum of per-sample terms (each depending only on its own row, as every GRPO loss
here is once its normalisation is fixed), the gradient of row n's term for a layer is built from that
layer's input and output-gradient of row n alone:
  Conv1D / Linear   dW_n = X_n^T G_n,  db_n = sum_t G_n,t
  Embedding         dE_n = scatter of G_n,t into the rows of the tokens (positions) of row n
  LayerNorm         dgamma_n = sum_t G_n,t * xhat_n,t,  dbeta_n = sum_t G_n,t
Tied weights (GPT-2's lm_head and wte) add their contributions before any norm is taken.
The naive reference (one backward per sample) lives in the tests.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers.pytorch_utils import Conv1D


class PerSampleGradients:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.records: list[tuple[torch.nn.Module, tuple, list]] = []
        self.handles = []

    def _capture(self, module, inputs, output):
        grads: list[torch.Tensor] = []
        if output.requires_grad:
            output.register_hook(lambda g: grads.append(g.detach()))
        self.records.append((module, tuple(i.detach() if torch.is_tensor(i) else i for i in inputs), grads))

    @contextmanager
    def capture(self):
        """Record inputs and output gradients of every parameterised layer during forward + backward."""
        self.records = []
        for module in self.model.modules():
            if isinstance(module, (Conv1D, torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)) and \
                    any(p.requires_grad for p in module.parameters(recurse=False)):
                self.handles.append(module.register_forward_hook(self._capture))
        try:
            yield self
        finally:
            for handle in self.handles:
                handle.remove()
            self.handles = []

    def _contributions(self):
        """(parameter, per-sample gradient (N, *shape)) for every recorded use of every parameter."""
        for module, inputs, grads in self.records:
            if not grads:
                continue
            G = grads[0].float()
            if isinstance(module, Conv1D):
                X = inputs[0].float()
                yield module.weight, torch.einsum("nti,nto->nio", X, G)
                yield module.bias, G.sum(1)
            elif isinstance(module, torch.nn.Linear):
                X = inputs[0].float()
                yield module.weight, torch.einsum("nto,nti->noi", G, X)
                if module.bias is not None:
                    yield module.bias, G.sum(1)
            elif isinstance(module, torch.nn.Embedding):
                ids = inputs[0].expand(G.shape[:2])
                N, V = G.shape[0], module.weight.shape[0]
                flat = (ids + torch.arange(N).unsqueeze(1) * V).flatten()
                out = torch.zeros(N * V, G.shape[-1]).index_add_(0, flat, G.flatten(0, 1))
                yield module.weight, out.view(N, V, -1)
            elif isinstance(module, torch.nn.LayerNorm):
                xhat = F.layer_norm(inputs[0].float(), module.normalized_shape, eps=module.eps)
                yield module.weight, (G * xhat).sum(1)
                yield module.bias, G.sum(1)

    def _uses(self) -> dict[int, int]:
        uses: dict[int, int] = {}
        for module, _, grads in self.records:
            if grads:
                for p in module.parameters(recurse=False):
                    uses[id(p)] = uses.get(id(p), 0) + 1
        return uses

    def _per_parameter(self):
        """(parameter, its full per-sample gradient), each as soon as all its uses are summed."""
        uses, pending = self._uses(), {}
        for param, grad in self._contributions():
            if not param.requires_grad:
                continue
            key = id(param)
            pending[key] = pending[key] + grad if key in pending else grad
            uses[key] -= 1
            if uses[key] == 0:
                yield param, pending.pop(key)

    def gradients(self) -> dict[torch.nn.Parameter, torch.Tensor]:
        """Per-sample gradient of every trainable parameter, (N, *param.shape); tied uses summed."""
        return dict(self._per_parameter())

    def norms(self) -> torch.Tensor:
        """(N,) per-sample gradient norms, holding one parameter's per-sample gradients at a time."""
        return torch.sqrt(sum(grad.flatten(1).pow(2).sum(1) for _, grad in self._per_parameter()))

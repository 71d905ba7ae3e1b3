"""Exact per-sample gradients from ONE backward pass, with module hooks, kept factored.

When the loss is a sum of per-sample terms (each depending only on its own row, as every GRPO loss
here is once its normalisation is fixed), a layer's gradient for row n is built from that layer's
input X_n and output gradient G_n alone:
  Conv1D (d_in, d_out)   dW_n = sum_t X_n,t (x) G_n,t          db_n = sum_t G_n,t
  Linear (out, in)       dW_n = sum_t G_n,t (x) X_n,t          db_n = sum_t G_n,t
  Embedding (V, d)       dE_n = sum_t onehot(id_n,t) (x) G_n,t      (times Gemma's embed_scale, applied inside)
  LayerNorm              dgamma_n = sum_t G_n,t * xhat_n,t,    dbeta_n = sum_t G_n,t
  RMSNorm                dgamma_n = sum_t G_n,t * x_n,t / rms(x_n,t)   (Llama, Qwen2; Gemma's 1 + gamma alike)
A trainable parameter of any other layer type has no rule: `capture` refuses it, naming it, rather than leave
its gradient out.
A weight's gradient stays a sum of outer products (`Outer`) and is never built unless asked for:
  - a dot product with one vector V (a summed validation gradient) is sum_t left_t^T V right_t;
  - an inner product of two such sums is sum_{t,s} <left_t, left_s> <right_t, right_s> ("ghost"
    products, T x S Gram matrices), chosen per layer when it costs less than building both.
Tied weights (GPT-2's lm_head and wte) keep one contribution per use; every product sums over all
pairs of uses, so the tied gradient is exact without ever being materialised. The naive reference
(one backward per sample) lives in the tests.

The update's fast path (`fast.backward`) uses these hooks for every sample's gradient norm.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.pytorch_utils import Conv1D


@dataclass
class Outer:
    """Per-sample gradient sum_t left[n, t] (x) right[n, t] of a (rows, cols) weight; an integer `left`
    (N, T) stands for one-hot rows (an embedding lookup)."""

    left: torch.Tensor  # (N, T, rows) float, or (N, T) token ids
    right: torch.Tensor  # (N, T, cols)
    rows: int

    @property
    def is_lookup(self) -> bool:
        return not self.left.is_floating_point()

    def materialize(self) -> torch.Tensor:
        if not self.is_lookup:
            return torch.einsum("ntr,ntc->nrc", self.left, self.right)
        N, _, C = self.right.shape
        flat = (self.left + torch.arange(N, device=self.left.device).unsqueeze(1) * self.rows).flatten()
        return (
            torch.zeros(N * self.rows, C, device=self.right.device)
            .index_add_(0, flat, self.right.flatten(0, 1))
            .view(N, self.rows, C)
        )

    def dot(self, vector: torch.Tensor) -> torch.Tensor:
        """(N,) <dW_n, vector> without building dW_n."""
        projected = vector[self.left] if self.is_lookup else self.left @ vector  # (N, T, cols)
        return torch.einsum("ntc,ntc->n", projected, self.right).double()


Contribution = Outer | torch.Tensor  # a dense (N, *shape) per-sample gradient for small parameters


def _gram(a: Outer, b: Outer) -> torch.Tensor:
    """(N, T, S) <left_a[t], left_b[s]>."""
    if a.is_lookup and b.is_lookup:
        return (a.left.unsqueeze(2) == b.left.unsqueeze(1)).float()
    if a.is_lookup:
        return _gram(b, a).transpose(1, 2)
    if b.is_lookup:
        return a.left.gather(2, b.left.unsqueeze(1).expand(-1, a.left.shape[1], -1))
    return a.left @ b.left.transpose(1, 2)


def _ghost_is_cheaper(a: Outer, b: Outer) -> bool:
    T, S, cols = a.right.shape[1], b.right.shape[1], a.right.shape[2]
    return T * S * (a.rows + cols) < (T + S) * a.rows * cols


def inner(a: Contribution, b: Contribution, ghost: bool | None = None) -> torch.Tensor:
    """(N,) <a_n, b_n> for two per-sample gradients of the same parameter; `ghost=None` picks the
    cheaper of Gram products and building both gradients."""
    both_outer = isinstance(a, Outer) and isinstance(b, Outer)
    if both_outer and (_ghost_is_cheaper(a, b) if ghost is None else ghost):
        right = a.right @ b.right.transpose(1, 2)
        return (_gram(a, b).double() * right.double()).sum((1, 2))
    a = a.materialize() if isinstance(a, Outer) else a
    b = b.materialize() if isinstance(b, Outer) else b
    return (a.double().flatten(1) * b.double().flatten(1)).sum(1)


def materialize(contribution: Contribution) -> torch.Tensor:
    return contribution.materialize() if isinstance(contribution, Outer) else contribution


def dot(contribution: Contribution, vector: torch.Tensor) -> torch.Tensor:
    if isinstance(contribution, Outer):
        return contribution.dot(vector)
    return contribution.double().flatten(1) @ vector.double().flatten()


def is_rms_norm(module: torch.nn.Module) -> bool:
    """transformers' RMSNorm layers (LlamaRMSNorm, Qwen2RMSNorm, GemmaRMSNorm, ...): one weight, no bias."""
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and getattr(module, "bias", None) is None
    )


def rms_normalized(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) in float32, as the layer computes it before its weight (or 1 + weight) scales it."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    x = x.float()
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return xhat.to(x.dtype)


def has_rule(module: torch.nn.Module) -> bool:
    return isinstance(module, (Conv1D, torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)) or is_rms_norm(module)


class PerSampleGradients:
    """Hooks on every layer with trainable parameters; after one forward + backward, `factors()` holds
    each trainable parameter's per-sample gradient as a list of contributions (one per use)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.records: list[tuple[torch.nn.Module, tuple, list]] = []
        self.handles = []

    def _batch_size(self, module, args, kwargs):
        inputs = kwargs.get("input_ids")
        inputs = inputs if inputs is not None else kwargs.get("inputs_embeds", args[0] if args else None)
        self.batch = inputs.shape[0] if torch.is_tensor(inputs) else None

    def _capture(self, module, inputs, output):
        grads: list[torch.Tensor] = []
        broadcast = isinstance(module, torch.nn.Embedding) and inputs[0].shape[0] == 1 and (self.batch or 1) > 1
        if broadcast:  # GPT-2's own position ids are (1, T): its gradient would arrive summed over the batch
            output = output.expand(self.batch, *output.shape[1:])
            inputs = (inputs[0].expand(self.batch, -1),)
        if output.requires_grad:
            output.register_hook(lambda g: grads.append(g.detach()))
        self.records.append((module, tuple(i.detach() if torch.is_tensor(i) else i for i in inputs), grads))
        return output if broadcast else None

    @contextmanager
    def capture(self):
        """Record inputs and output gradients of every parameterised layer during forward + backward."""
        self.records, self.batch = [], None
        unruled = [
            f"{name} ({type(module).__name__})"
            for name, module in self.model.named_modules()
            if any(p.requires_grad for p in module.parameters(recurse=False)) and not has_rule(module)
        ]
        if unruled:
            raise ValueError(
                f"no per-sample gradient rule for the trainable parameters of {', '.join(unruled)}: "
                "freeze them (requires_grad_(False)) or add a rule to grpo_debug/fast/per_sample.py"
            )
        self.handles.append(self.model.register_forward_pre_hook(self._batch_size, with_kwargs=True))
        for module in self.model.modules():
            if has_rule(module) and any(p.requires_grad for p in module.parameters(recurse=False)):
                self.handles.append(module.register_forward_hook(self._capture))
        try:
            yield self
        finally:
            for handle in self.handles:
                handle.remove()
            self.handles = []

    def _contributions(self):
        for module, inputs, grads in self.records:
            if not grads:
                continue
            G = grads[0].float()
            if isinstance(module, Conv1D):
                yield module.weight, Outer(inputs[0].float(), G, module.weight.shape[0])
                yield module.bias, G.sum(1)
            elif isinstance(module, torch.nn.Linear):
                yield module.weight, Outer(G, inputs[0].float(), module.weight.shape[0])
                if module.bias is not None:
                    yield module.bias, G.sum(1)
            elif isinstance(module, torch.nn.Embedding):
                scale = getattr(module, "embed_scale", None)  # Gemma's scaled embedding multiplies inside its forward
                yield (
                    module.weight,
                    Outer(
                        inputs[0],
                        G if scale is None else G * scale.to(G.dtype) if torch.is_tensor(scale) else G * scale,
                        module.weight.shape[0],
                    ),
                )
            elif isinstance(module, torch.nn.LayerNorm):
                xhat = F.layer_norm(inputs[0].float(), module.normalized_shape, eps=module.eps)
                yield module.weight, (G * xhat).sum(1)
                yield module.bias, G.sum(1)
            elif is_rms_norm(module):
                yield module.weight, (G * rms_normalized(module, inputs[0])).sum(1)

    def factors(self) -> dict[torch.nn.Parameter, list[Contribution]]:
        out: dict[torch.nn.Parameter, list[Contribution]] = {}
        for param, contribution in self._contributions():
            if param.requires_grad:
                out.setdefault(param, []).append(contribution)
        return out


class SampleGradients:
    """Every sample's gradient, factored, as captured chunk by chunk (rows in order)."""

    def __init__(self, chunks: list[dict[torch.nn.Parameter, list[Contribution]]]):
        self.chunks = chunks

    @classmethod
    def of(cls, hooks: PerSampleGradients) -> SampleGradients:
        return cls([hooks.factors()])

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return list(self.chunks[0])

    def gradients(self) -> dict[torch.nn.Parameter, torch.Tensor]:
        """{param: (N, *param.shape)}, materialised (small models and tests only)."""
        return {
            p: torch.cat([sum(materialize(c) for c in chunk[p]).view(-1, *p.shape) for chunk in self.chunks])
            for p in self.params
        }

    def dot(self, vectors: dict[torch.nn.Parameter, torch.Tensor]) -> torch.Tensor:
        """(N,) <g_n, vectors> summed over every parameter, in float64."""
        return torch.cat([sum(dot(c, vectors[p]) for p, cs in chunk.items() for c in cs) for chunk in self.chunks])

    def inner(self, other: SampleGradients) -> torch.Tensor:
        """(N,) <g_n, h_n>: each sample's gradient against the same sample's gradient in `other`."""
        return torch.cat(
            [
                sum(inner(a, b) for p, cs in mine.items() for a in cs for b in theirs[p])
                for mine, theirs in zip(self.chunks, other.chunks)
            ]
        )

    def squared_norms(self) -> torch.Tensor:
        return self.inner(self)

    def norms(self) -> torch.Tensor:
        """(N,) per-sample gradient norms (float64 accumulation)."""
        return self.squared_norms().clamp(min=0).sqrt().float()

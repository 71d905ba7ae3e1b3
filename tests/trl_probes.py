"""Run TRL 1.16's own GRPOTrainer code on given tensors, with no model and no generation.

`LossProbe` calls the real `GRPOTrainer._compute_loss` with `_get_per_token_logps_and_entropies`
returning the given log-probs; `AdvProbe` calls the real `_generate_and_score_completions` (and its
reward aggregation) with generation stubbed out; `ISProbe` (behind `trl_importance_sampling`) runs that same
method with `use_vllm=True, vllm_importance_sampling_correction=True` to get TRL's vLLM importance-sampling ratio
and its sampling/* metrics. `trl_high_entropy_mask` and `trl_off_policy_mask` call TRL's own helpers. Only the
attributes those methods read are set.
"""

import types
from collections import defaultdict, deque

import torch
from accelerate import PartialState
from trl import GRPOTrainer

PartialState(cpu=True)  # accelerate's gather needs an initialised single-process state


class _StubAccelerator:
    """Single-process stand-in: gather/reduce are identity (what accelerate does with 1 process)."""

    num_processes = 1
    process_index = 0
    is_main_process = True
    sync_gradients = True  # read by _compute_loss's entropy bonus (optimizer-step boundary); True = no accumulation ctx
    device = torch.device("cpu")

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


class LossProbe(GRPOTrainer):
    """GRPOTrainer subclass whose __init__ only sets the attributes `_compute_loss` reads."""

    def __init__(
        self,
        *,
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=None,
        delta=None,
        use_bias_correction_kl=True,
        importance_sampling_level="token",
        max_completion_length=512,
        grad_accum=1,
        steps_per_generation=1,
        training=True,
        accelerator=None,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        entropy_coef=0.0,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        vespo=(2.0, 3.0, 3.0, 2.0),
    ):
        # NB: do NOT call super().__init__
        self.loss_type = loss_type
        self.beta = beta
        self.epsilon_low = epsilon
        self.epsilon_high = epsilon_high if epsilon_high is not None else epsilon
        self.importance_sampling_level = importance_sampling_level
        self.max_completion_length = max_completion_length
        self.current_gradient_accumulation_steps = grad_accum
        self.top_entropy_quantile = top_entropy_quantile
        self.off_policy_mask_threshold = off_policy_mask_threshold
        self.aux_loss_enabled = False
        self.router_aux_loss_coef = 0.0  # read only when aux_loss_enabled (MoE); never here
        self.use_vllm = False  # loss() sets both to True when an importance_sampling_ratio is given
        self.vllm_importance_sampling_correction = False
        self.entropy_coef = entropy_coef
        self.use_adaptive_entropy = False
        self._last_world_entropy = None  # adaptive-entropy state: read only when use_adaptive_entropy
        self._entropy_window_stats = None
        self._entropy_bonus_enabled = entropy_coef != 0.0
        self.model = types.SimpleNamespace(training=training)  # only .training is read
        self.accelerator = accelerator or _StubAccelerator()
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        # self.args.* read by _compute_loss
        self.args = types.SimpleNamespace(
            use_bias_correction_kl=use_bias_correction_kl,
            delta=delta,
            steps_per_generation=steps_per_generation,
            sapo_temperature_pos=sapo_temperature_pos,
            sapo_temperature_neg=sapo_temperature_neg,
            vespo_k_pos=vespo[0],
            vespo_lambda_pos=vespo[1],
            vespo_k_neg=vespo[2],
            vespo_lambda_neg=vespo[3],
            entropy_target=None,
            entropy_coef_delta=None,
            entropy_coef_max=None,
            entropy_coef_min=None,
        )
        self._given = None

    # Replace the model forward: return our given per-token logps / entropies
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        logps, ent = self._given
        assert logps.shape[1] == logits_to_keep
        return logps, ent, None

    def loss(
        self,
        per_token_logps,
        advantages,
        completion_mask,
        old_per_token_logps=None,
        ref_per_token_logps=None,
        entropies=None,
        num_items_in_batch=None,
        sampling_per_token_logps=None,
        importance_sampling_ratio=None,
    ):
        """Run the real `_compute_loss` on the given tensors; returns (loss, {metric: last value}).

        `sampling_per_token_logps` (B, T) goes into `inputs` as the trainer puts it there with vLLM (read by the
        off-policy mask). `importance_sampling_ratio` ((B, T) token modes or (B, 1) sequence modes, e.g. from
        `trl_importance_sampling`) goes into `inputs` and turns on `use_vllm` and
        `vllm_importance_sampling_correction` for this call, so `_compute_loss` multiplies the per-token loss by it
        (vespo instead folds it into its gamma weights)."""
        B, T = per_token_logps.shape
        if entropies is None:
            entropies = torch.zeros_like(per_token_logps)
        self._given = (per_token_logps, entropies)
        inputs = {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
            "prompt_mask": torch.ones(B, 1, dtype=torch.long),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": completion_mask,
            "advantages": advantages,
            # in the trainer this is gather(mask.sum()).sum() over the *generation* batch
            "num_items_in_batch": completion_mask.sum() if num_items_in_batch is None else num_items_in_batch,
        }
        if old_per_token_logps is not None:
            inputs["old_per_token_logps"] = old_per_token_logps
        if ref_per_token_logps is not None:
            inputs["ref_per_token_logps"] = ref_per_token_logps
        if sampling_per_token_logps is not None:
            inputs["sampling_per_token_logps"] = sampling_per_token_logps
        use_is = importance_sampling_ratio is not None
        if use_is:
            inputs["importance_sampling_ratio"] = importance_sampling_ratio
        self.use_vllm = self.vllm_importance_sampling_correction = use_is
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        loss = self._compute_loss(None, inputs)
        mode = "train" if self.model.training else "eval"
        return loss, {k: v[-1] for k, v in self._metrics[mode].items()}


class AdvProbe(GRPOTrainer):
    def __init__(
        self,
        rewards_per_func,
        num_generations,
        scale_rewards="group",
        reward_weights=None,
        multi_objective_aggregation="sum_then_normalize",
        training=True,
    ):
        # rewards_per_func: (N, K) tensor/list; None/NaN entries allowed (= reward func returned None)
        r = torch.as_tensor(rewards_per_func, dtype=torch.float32)
        if r.dim() == 1:
            r = r[:, None]
        self._given_rewards = r
        N, K = r.shape
        self.num_generations = num_generations
        self.num_generations_eval = num_generations
        self.scale_rewards = scale_rewards
        self.multi_objective_aggregation = multi_objective_aggregation
        self.reward_weights = (
            torch.ones(K) if reward_weights is None else torch.tensor(reward_weights, dtype=torch.float32)
        )

        # real reward functions -> real _calculate_rewards (None -> NaN conversion, float32 tensor, gather)
        def make(k):
            def f(prompts, completions, idx, **kw):
                return [None if torch.isnan(r[i, k]) else r[i, k].item() for i in idx]

            f.__name__ = f"reward_{k}"
            return f

        self.reward_funcs = [make(k) for k in range(K)]
        self.reward_func_names = [f.__name__ for f in self.reward_funcs]
        self.reward_processing_classes = [None] * K

        self.accelerator = _StubAccelerator()
        self.model = types.SimpleNamespace(training=training, is_gradient_checkpointing=False)
        self.args = types.SimpleNamespace(
            per_device_train_batch_size=N,
            per_device_eval_batch_size=N,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            gradient_checkpointing_kwargs=None,
            report_to=[],
        )
        self.num_iterations = 1
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.beta = 0.0  # no ref-model forward
        self.environment_factories = None
        self.environments = None
        self.tools = None
        self.mask_truncated_completions = False
        self.pad_to_multiple_of = None
        self.eos_token_ids = [0]
        self._tokenizer = types.SimpleNamespace(pad_token_id=0)
        self.log_multimodal = False
        self.state = types.SimpleNamespace(global_step=0)  # read by profiling_context + passed to reward funcs
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logs = {
            "images": deque(),
            "prompt": deque(),
            "completion": deque(),
            "rewards": defaultdict(deque),
            "advantages": deque(),
            "extra": defaultdict(deque),
        }
        self._pending_extra_logs = defaultdict(list)
        self._pending_metrics = defaultdict(list)

    def _generate(self, prompts):  # stubbed generation: 1 prompt token, 1 completion token each
        n = len(prompts)
        return ([[1]] * n, [[2]] * n, None, ["c"] * n, None, None, None, None)

    def advantages(self):
        N = self._given_rewards.shape[0]
        inputs = [{"prompt": f"p{i // self.num_generations}", "idx": i} for i in range(N)]
        out = self._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        return out["advantages"], {k: v[-1] for k, v in self._metrics[mode].items()}


def trl_per_token_logps(
    model,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    temperature,
    bf16=False,
    batch_size=None,
    train=False,
    seed=None,
):
    """TRL 1.16's own `GRPOTrainer._get_per_token_logps_and_entropies` on a copy of `model` patched with TRL's
    `add_fused_lm_head` (as `GRPOTrainer.__init__` does): input_ids and attention_mask as the trainer builds
    them, autocast as accelerate's with `bf16`. Returns (log-probs, entropies), each (N, C)."""
    import copy
    import functools
    from contextlib import nullcontext

    from trl.trainer.utils import add_fused_lm_head

    patched = copy.deepcopy(model)
    add_fused_lm_head(patched, temperature=temperature, outputs=("log_probs", "entropy"))
    patched.train(train)
    autocast = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16) if bf16 else nullcontext
    probe = types.SimpleNamespace(accelerator=types.SimpleNamespace(autocast=autocast, is_main_process=True))
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            probe,
            patched,
            input_ids,
            attention_mask,
            completion_ids.shape[1],
            batch_size=batch_size,
            compute_entropy=True,
        )
    return logps, entropies


class ISProbe(AdvProbe):
    """The real `_generate_and_score_completions` with `use_vllm=True, vllm_importance_sampling_correction=True`:
    the stubbed `_generate` returns the given sampling log-probs as vLLM's `logprobs` (5th item of its tuple), and
    `_get_per_token_logps_and_entropies` returns the given `old_per_token_logps`. Rewards are all zero (the
    advantage path runs but is not looked at); beta=0 so there is no reference forward; no tools, images or
    environments."""

    def __init__(
        self, old_per_token_logps, sampling_per_token_logps, completion_mask, mode, clip_min=None, clip_max=3.0
    ):
        B, T = old_per_token_logps.shape
        assert sampling_per_token_logps.shape == (B, T) and completion_mask.shape == (B, T)
        super().__init__(torch.zeros(B, 1), num_generations=B)
        self.use_vllm = True
        self.vllm_importance_sampling_correction = True
        self.vllm_importance_sampling_mode = mode
        self.vllm_importance_sampling_clip_min = clip_min
        self.vllm_importance_sampling_clip_max = clip_max
        self._old = old_per_token_logps
        m = completion_mask.long().cpu()
        lengths = m.sum(1)
        prefix = torch.arange(T)[None, :] < lengths[:, None]
        if bool((m.bool() == prefix).all()) and int(lengths.max()) == T and int(lengths.min()) > 0:
            # right-padded mask: completions of length L_i; TRL pads them to T and builds completion_mask = the
            # given mask (ones per token, right-padded with 0). Sampling logps beyond L_i are dropped (TRL pads 0.0).
            self._lengths = lengths.tolist()
            self._tool_mask = None
        else:
            # Mask TRL cannot build from lengths alone (a hole, every row shorter than T, an empty row): full-length
            # completions with the given mask as `tool_mask` (what TRL's own tool/env masking feeds the same
            # block: mask = completion_mask * tool_mask).
            self._lengths = [T] * B
            self._tool_mask = m.tolist()
        self._sampling = [row[:n] for row, n in zip(sampling_per_token_logps.detach().cpu().tolist(), self._lengths)]

    def _generate(self, prompts):
        n = len(prompts)
        completion_ids = [[2] * L for L in self._lengths]  # token 2: neither EOS nor pad (0)
        # (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images)
        return ([[1]] * n, completion_ids, self._tool_mask, ["c"] * n, self._sampling, None, None, None)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        assert logits_to_keep == self._old.shape[1]
        return self._old.detach(), None, None  # TRL computes it under torch.no_grad()

    def run(self):
        B = self._old.shape[0]
        out = self._generate_and_score_completions([{"prompt": "p", "idx": i} for i in range(B)])
        mode = "train" if self.model.training else "eval"
        metrics = {k: v[-1] for k, v in self._metrics[mode].items() if k.startswith("sampling/")}
        return out, metrics


def trl_importance_sampling(
    old_per_token_logps, sampling_per_token_logps, completion_mask, mode, clip_min=None, clip_max=3.0
):
    """TRL 1.16's vLLM importance-sampling correction, run inside the real `_generate_and_score_completions`
    (see `ISProbe`). `mode`: token_truncate | token_mask | sequence_truncate | sequence_mask.

    Returns (ratio, metrics): ratio is `output["importance_sampling_ratio"]`, (B, T) for token modes and (B, 1) for
    sequence modes (detached; dtype as TRL computes it: the sampling log-probs go through Python floats into a
    float32 tensor, as vLLM's do); metrics holds `sampling/sampling_logp_difference/{mean,max}` and
    `sampling/importance_sampling_ratio/{min,mean,max}` as floats."""
    out, metrics = ISProbe(
        old_per_token_logps, sampling_per_token_logps, completion_mask, mode, clip_min=clip_min, clip_max=clip_max
    ).run()
    return out["importance_sampling_ratio"], metrics


def trl_high_entropy_mask(entropies, mask, top_entropy_quantile):
    """TRL 1.16's `GRPOTrainer.get_high_entropy_mask(entropies, mask, 1 - top_entropy_quantile)`, as
    `_compute_loss` calls it, with the single-process stub accelerator (pad_across_processes and gather are the
    identity, as accelerate's are with one process). Returns a bool tensor of the shape of `entropies`."""
    probe = types.SimpleNamespace(accelerator=_StubAccelerator())
    return GRPOTrainer.get_high_entropy_mask(probe, entropies, mask, 1 - top_entropy_quantile)


def trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, threshold):
    """TRL 1.16's static `GRPOTrainer.get_off_policy_mask`. 1-D advantages are unsqueezed to (B, 1) first, as
    `_compute_loss` does before calling it. Returns a (B, 1) tensor of mask's dtype: 1 keep, 0 drop."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return GRPOTrainer.get_off_policy_mask(
        advantages=advantages,
        per_token_logps=per_token_logps,
        sampling_per_token_logps=sampling_per_token_logps,
        mask=mask,
        off_policy_threshold=threshold,
    )

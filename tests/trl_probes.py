"""Run TRL 1.16's own GRPOTrainer code on given tensors, with no model and no generation.

`LossProbe` calls the real `GRPOTrainer._compute_loss` with `_get_per_token_logps_and_entropies`
returning the given log-probs; `AdvProbe` calls the real `_generate_and_score_completions` (and its
reward aggregation) with generation stubbed out. Only the attributes those methods read are set.
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

    def __init__(self, *, loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=None, delta=None,
                 use_bias_correction_kl=True, importance_sampling_level="token", max_completion_length=512,
                 grad_accum=1, steps_per_generation=1, training=True, accelerator=None,
                 top_entropy_quantile=1.0, off_policy_mask_threshold=None, entropy_coef=0.0,
                 sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                 vespo=(2.0, 3.0, 3.0, 2.0)):
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
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.entropy_coef = entropy_coef
        self.use_adaptive_entropy = False
        self._entropy_bonus_enabled = entropy_coef != 0.0
        self.model = types.SimpleNamespace(training=training)  # only .training is read
        self.accelerator = accelerator or _StubAccelerator()
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        # self.args.* read by _compute_loss
        self.args = types.SimpleNamespace(
            use_bias_correction_kl=use_bias_correction_kl, delta=delta, steps_per_generation=steps_per_generation,
            sapo_temperature_pos=sapo_temperature_pos, sapo_temperature_neg=sapo_temperature_neg,
            vespo_k_pos=vespo[0], vespo_lambda_pos=vespo[1], vespo_k_neg=vespo[2], vespo_lambda_neg=vespo[3],
            entropy_target=None, entropy_coef_delta=None, entropy_coef_max=None, entropy_coef_min=None,
        )
        self._given = None

    # Replace the model forward: return our given per-token logps / entropies
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        logps, ent = self._given
        assert logps.shape[1] == logits_to_keep
        return logps, ent, None

    def loss(self, per_token_logps, advantages, completion_mask, old_per_token_logps=None,
             ref_per_token_logps=None, entropies=None, num_items_in_batch=None):
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
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        loss = self._compute_loss(None, inputs)
        mode = "train" if self.model.training else "eval"
        return loss, {k: v[-1] for k, v in self._metrics[mode].items()}


class AdvProbe(GRPOTrainer):
    def __init__(self, rewards_per_func, num_generations, scale_rewards="group", reward_weights=None,
                 multi_objective_aggregation="sum_then_normalize", training=True):
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
        self.reward_weights = torch.ones(K) if reward_weights is None else torch.tensor(reward_weights, dtype=torch.float32)

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
        self.args = types.SimpleNamespace(per_device_train_batch_size=N, per_device_eval_batch_size=N,
                                          steps_per_generation=1, gradient_accumulation_steps=1,
                                          gradient_checkpointing_kwargs=None, report_to=[])
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
        self._logs = {"images": deque(), "prompt": deque(), "completion": deque(),
                      "rewards": defaultdict(deque), "advantages": deque(), "extra": defaultdict(deque)}
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




def trl_per_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature,
                        bf16=False, batch_size=None, train=False, seed=None):
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
            probe, patched, input_ids, attention_mask, completion_ids.shape[1], batch_size=batch_size,
            compute_entropy=True)
    return logps, entropies

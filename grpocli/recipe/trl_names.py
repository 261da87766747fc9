"""TRL 1.16's GRPOConfig fields and the recipe key for each, for users coming from TRL.

`TRL_FIELDS[name] = (recipe key or None, note)`: None means grpo has no such setting (the note
says why or what to use). Every GRPOConfig field of its own is listed, and the TrainingArguments
fields a GRPO run sets; `grpo inspect fields --trl NAME` and the docs' generated page reference/trl-fields.md read it.
The keys' own meaning, bounds and defaults stay in the schema (grpocli.recipe.schema).
"""

from __future__ import annotations

HUB = ("grpo does not push: after the run, `grpo export RUN_DIR DIR` then `hf upload HUB_ID DIR` "
       "(docs/coming-from-trl.md, Pushing to the Hub)")

TRL_FIELDS: dict[str, tuple[str | None, str]] = {
    # --- TrainingArguments that a GRPO run sets ---
    "output_dir": ("train.output_dir", ""),
    "max_steps": ("train.steps",
                  "optimizer steps, as TRL's; TRL's default -1 (num_train_epochs 3 over the data); grpo's 100"),
    "num_train_epochs": ("train.num_train_epochs", "steps = ceil(epochs x generation batches x steps_per_generation x "
                         "num_iterations), as TRL; a train.steps "
                         "set in the recipe wins, as TRL's max_steps; TRL's default 3; grpo's none (train.steps)"),
    "learning_rate": ("train.learning_rate", ""),
    "lr_scheduler_type": ("train.lr_scheduler", "constant, linear, cosine, constant_with_warmup; TRL's default linear; "
                          "grpo's constant"),
    "warmup_steps": ("train.warmup_steps", "unit: TRL's value below 1 is a ratio of max_steps (grpo import trl writes "
                     "ceil(max_steps x ratio)); grpo's counts steps"),
    "warmup_ratio": ("train.warmup_ratio", "ceil(ratio x steps); a warmup_steps above 0 wins, as in TRL"),
    "weight_decay": ("train.weight_decay", ""),
    "adam_beta1": ("train.adam_beta1", ""),
    "adam_beta2": ("train.adam_beta2", ""),
    "max_grad_norm": ("train.max_grad_norm", ""),
    "seed": ("train.seed", "TRL's default 42; grpo's 0"),
    "bf16": ("train.mixed_precision", "'bf16'; TRL's default true (unless fp16); grpo's 'no'"),
    "fp16": ("train.mixed_precision", "'fp16'"),
    "gradient_checkpointing": ("model.gradient_checkpointing", "TRL's default true; grpo's false"),
    "per_device_train_batch_size": ("train.micro_batch_size",
                                    "completions per forward/backward; unit: TRL's step is this x "
                                    "gradient_accumulation_steps x processes completions, grpo's step "
                                    "train.prompts_per_step prompts (see gradient_accumulation_steps)"),
    "gradient_accumulation_steps": ("train.prompts_per_step",
                                    "unit: grpo sets the batch in prompts: prompts_per_step = "
                                    "per_device_train_batch_size x gradient_accumulation_steps x processes / "
                                    "num_generations, split into micro-batches; TRL's defaults make 1 prompt a "
                                    "step (8 x 1 / 8); grpo's 8"),
    "save_steps": ("train.save_steps", "TRL's default 500; grpo's 0 (at the end only)"),
    "save_total_limit": ("train.save_total_limit", ""),
    "logging_steps": (None, "every step is logged to metrics.jsonl"),
    "report_to": ("log.report_to", "a name or a list, 'none', 'all'; keys train/... and eval/... as TRL's"),
    "eval_steps": ("eval.every", ""),
    "resume_from_checkpoint": ("train.resume", "true: 'auto' (the newest checkpoint in output_dir); a path: that "
                               "checkpoint"),
    "save_strategy": ("train.save_steps", "TRL's default 'steps': save_steps; 'no': 0 (grpo still saves at the end); 'epoch': 0 "
                      "(at the end) with one epoch, else set train.save_steps to the steps of an epoch"),
    "eval_on_start": ("eval.on_start", ""),
    "ddp_timeout": ("train.collective_timeout", "seconds a process waits for the others"),
    "push_to_hub": (None, HUB),
    "hub_model_id": (None, HUB),
    "run_name": (None, "trackers name the run themselves (WANDB_NAME sets wandb's)"),
    "overwrite_output_dir": (None, "train.resume = 'auto' continues the run in output_dir; 'never' refuses a "
                             "non-empty one"),
    "gradient_checkpointing_kwargs": (None, "grpo checkpoints with use_reentrant = false, as TRL's default"),
    "logging_strategy": (None, "every step is logged to metrics.jsonl"),
    "logging_first_step": (None, "every step is logged to metrics.jsonl"),
    "do_eval": (None, "eval.every and eval.split evaluate during a run; `grpo eval` after it"),
    # --- GRPOConfig: model and data ---
    "model_init_kwargs": ("model.dtype", "dtype and attn_implementation are keys of [model]; TRL's default dtype "
                          "'auto' (transformers 5); grpo's float32"),
    "trust_remote_code": ("model.trust_remote_code", ""),
    "router_aux_loss_coef": (None, "MoE auxiliary loss: not supported"),
    "disable_dropout": (None, "not supported"),
    "cast_lm_head_to_fp32": (None, "log-probs are computed in float32 from any dtype"),
    "shuffle_dataset": ("data.shuffle", ""),
    "chat_template_kwargs": ("data.chat_template_kwargs", "e.g. {enable_thinking = false}"),
    "pad_to_multiple_of": (None, "micro-batches are packed or padded to their longest row"),
    # --- GRPOConfig: generation ---
    "num_generations": ("generation.num_generations", "G"),
    "num_generations_eval": ("eval.n", ""),
    "max_completion_length": ("generation.max_completion_length", "TRL's default 512; grpo's 64"),
    "generation_batch_size": ("train.steps_per_generation",
                              "unit: TRL counts completions, grpo optimizer steps: steps_per_generation = "
                              "generation_batch_size / (per_device_train_batch_size x gradient_accumulation_steps "
                              "x processes)"),
    "steps_per_generation": ("train.steps_per_generation",
                             "unit: TRL counts micro-batches, grpo optimizer steps: grpo's = TRL's / "
                             "gradient_accumulation_steps; TRL's default gradient_accumulation_steps (= grpo's 1)"),
    "temperature": ("generation.temperature", ""),
    "top_p": ("generation.top_p", ""),
    "top_k": ("generation.top_k", ""),
    "min_p": ("generation.min_p", ""),
    "repetition_penalty": ("generation.repetition_penalty", ""),
    "generation_kwargs": ("generation.stop", "stop strings; other sampling keys are [generation] keys"),
    "cache_implementation": (None, "transformers' default cache"),
    "ds3_gather_for_generation": (None, "always on: ZeRO-3 weights are gathered whole for a weight sync (TRL's default)"),
    "use_transformers_continuous_batching": ("generation.backend", "TRL's default false; true: 'paged' (transformers' continuous "
                                             "batching)"),
    "transformers_continuous_batching_config": (None, "grpo's paged backend sets its own"),
    "use_transformers_paged": ("generation.backend", "TRL's default false; true: 'paged' (transformers' paged attention)"),
    # --- GRPOConfig: vLLM ---
    "use_vllm": ("generation.backend", "'vllm' (colocate) or 'vllm-server'; false: 'hf' (TRL's default; grpo's "
                 "is 'auto', the fastest backend installed)"),
    "vllm_mode": ("generation.backend", "colocate -> 'vllm', server -> 'vllm-server'"),
    "vllm_model_impl": (None, "vLLM's own implementation"),
    "vllm_enable_sleep_mode": ("vllm.sleep_mode", "TRL's true is level 2"),
    "vllm_structured_outputs_regex": (None, "not supported in training; TRL's client can send it to grpo vllm-serve"),
    "vllm_server_base_url": ("vllm.server_url", ""),
    "vllm_server_host": ("vllm.server_url", "host and port in one URL"),
    "vllm_server_port": ("vllm.server_url", "host and port in one URL"),
    "vllm_server_timeout": ("vllm.server_timeout", ""),
    "vllm_group_port": (None, "the weight-transfer port is chosen per sync"),
    "vllm_gpu_memory_utilization": ("vllm.gpu_memory_utilization", ""),
    "vllm_max_model_length": ("vllm.max_model_len", ""),
    "vllm_tensor_parallel_size": (None, "the colocated engine runs one per process; tensor parallelism: "
                                  "grpo vllm-serve --tensor-parallel-size N"),
    "vllm_importance_sampling_correction": ("vllm.importance_sampling_correction", ""),
    "vllm_importance_sampling_mode": ("vllm.importance_sampling_mode", "TRL's default sequence_mask; grpo's token_truncate"),
    "vllm_importance_sampling_clip_max": ("vllm.importance_sampling_clip_max", "TRL's default 3.0; grpo's 2.0"),
    "vllm_importance_sampling_clip_min": ("vllm.importance_sampling_clip_min", ""),
    "vllm_importance_sampling_cap": ("vllm.importance_sampling_cap", "deprecated in TRL and here: clip_max"),
    # --- GRPOConfig: the algorithm ---
    "beta": ("algorithm.beta", ""),
    "num_iterations": ("algorithm.num_iterations", ""),
    "epsilon": ("algorithm.epsilon_low", "TRL's epsilon is the lower (and default upper) clip"),
    "epsilon_high": ("algorithm.epsilon_high", "TRL defaults it to epsilon"),
    "delta": ("algorithm.delta", ""),
    "sapo_temperature_neg": ("algorithm.sapo_temperature_neg", ""),
    "sapo_temperature_pos": ("algorithm.sapo_temperature_pos", ""),
    "vespo_k_pos": ("algorithm.vespo_k_pos", ""),
    "vespo_lambda_pos": ("algorithm.vespo_lambda_pos", ""),
    "vespo_k_neg": ("algorithm.vespo_k_neg", ""),
    "vespo_lambda_neg": ("algorithm.vespo_lambda_neg", ""),
    "importance_sampling_level": ("algorithm.importance_sampling_level", "'sequence' with a token-summing loss "
                                  "(dapo, bnpo, dr_grpo, cispo) runs with TRL's note"),
    "reward_weights": ("rewards[].weight", "one weight per [[rewards]] entry"),
    "multi_objective_aggregation": ("algorithm.advantage_scale",
                                    "sum_then_normalize -> 'group' (or 'batch'), normalize_then_sum -> "
                                    "'normalize_then_sum'"),
    "scale_rewards": ("algorithm.advantage_scale", "group, batch, none"),
    "loss_type": ("algorithm.loss", ""),
    "mask_truncated_completions": ("algorithm.mask_truncated_completions", "with algorithm.truncated_rows = 'count' as TRL"),
    "sync_ref_model": ("algorithm.ref_sync_steps", "on when ref_sync_steps > 0"),
    "ref_model_mixup_alpha": ("algorithm.ref_sync_alpha", "TRL's default 0.6; grpo's 1.0"),
    "ref_model_sync_steps": ("algorithm.ref_sync_steps",
                             "TRL's default 512 (used with sync_ref_model); grpo's 0 (off)"),
    "top_entropy_quantile": ("algorithm.top_entropy_quantile", ""),
    "entropy_coef": ("algorithm.entropy_coef", ""),
    "use_adaptive_entropy": (None, "adaptive entropy control (Skywork-OR1): not supported"),
    "entropy_coef_min": (None, "adaptive entropy control: not supported"),
    "entropy_coef_max": (None, "adaptive entropy control: not supported"),
    "entropy_coef_delta": (None, "adaptive entropy control: not supported"),
    "entropy_target": (None, "adaptive entropy control: not supported"),
    "max_tool_calling_iterations": (None, "tools are not supported yet"),
    "off_policy_mask_threshold": (None, "off-policy sequence masking: not supported"),
    "use_bias_correction_kl": ("algorithm.kl_importance_correction", "TRL's default true; grpo's false"),
    # --- GRPOConfig: logging ---
    "log_completions": ("log.completions_to_print", "printed live: set completions_to_print = N; every "
                        "completion of a step also goes to rollouts/step-N.jsonl (log.rollouts_every); TRL's "
                        "default false; grpo's 0"),
    "log_multimodal": (None, "text only"),
    "num_completions_to_print": ("log.completions_to_print", "a rich table on a terminal, plain text otherwise"),
    "log_unique_prompts": (None, "rollouts hold every prompt"),
    "log_completions_hub_repo": (None, "no hub uploads"),
}


#: The other TrainingArguments fields GRPOConfig inherits (transformers 5): none has a grpo equivalent.
INHERITED = frozenset("""
lr_scheduler_kwargs optim optim_args adam_epsilon optim_target_modules average_tokens_across_devices
label_smoothing_factor bf16_full_eval fp16_full_eval tf32 torch_compile torch_compile_backend torch_compile_mode
use_liger_kernel liger_kernel_config use_cache neftune_noise_alpha torch_empty_cache_steps auto_find_batch_size
log_on_each_node logging_nan_inf_filter include_num_input_tokens_seen log_level log_level_replica disable_tqdm
project trackio_space_id trackio_bucket_id trackio_static_space_id eval_strategy eval_delay per_device_eval_batch_size
prediction_loss_only eval_do_concat_batches eval_use_gather_object eval_accumulation_steps include_for_metrics
batch_eval_metrics save_only_model save_on_each_node enable_jit_checkpoint hub_token hub_private_repo hub_strategy
hub_always_push hub_revision load_best_model_at_end metric_for_best_model greater_is_better ignore_data_skip
restore_callback_states_from_checkpoint full_determinism data_seed use_cpu accelerator_config parallelism_config
dataloader_drop_last dataloader_num_workers dataloader_pin_memory dataloader_persistent_workers
dataloader_prefetch_factor dataloader_multiprocessing_context dataloader_in_order remove_unused_columns label_names
train_sampling_strategy length_column_name ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers
ddp_static_graph ddp_backend fsdp fsdp_config deepspeed debug skip_memory_metrics do_train do_predict local_rank
torch_dtype_auto per_gpu_train_batch_size per_gpu_eval_batch_size evaluation_strategy logging_dir
""".split()) - set(TRL_FIELDS)


#: TRL 1.16's defaults that `grpo import trl` writes out when a config leaves them unset: each
#: differs from grpo's default, or feeds the batch arithmetic (tests check them against GRPOConfig).
TRL_DEFAULTS: dict[str, object] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "max_steps": -1,
    "lr_scheduler_type": "linear",
    "gradient_checkpointing": True,
    "max_completion_length": 512,
    "seed": 42,
    "bf16": None,  # GRPOConfig: None means True unless fp16 is set
    "model_init_kwargs": None,  # transformers 5 then infers the dtype ('auto')
    "save_steps": 500,
    "epsilon": 0.2,
    "use_bias_correction_kl": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 3.0,
    "use_vllm": False,  # transformers' generate; grpo's default is 'auto'
}


#: The fields whose unit differs from their recipe key's (their notes start the difference with "unit:").
TRL_UNITS = ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
             "steps_per_generation", "warmup_steps")


def lookup(name: str) -> dict[str, tuple[str | None, str]]:
    """The entries whose TRL name contains ``name`` (case-insensitive), exact match first."""
    needle = name.lower()
    hits = {k: v for k, v in TRL_FIELDS.items() if needle in k.lower()}
    return dict(sorted(hits.items(), key=lambda kv: (kv[0].lower() != needle, kv[0])))

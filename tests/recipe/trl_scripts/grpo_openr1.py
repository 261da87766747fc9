"""open-r1's src/open_r1/grpo.py, as its users copy it: its configs (GRPOScriptArguments, a GRPOConfig with
system_prompt) and a reward registry by name, in one file (open-r1 itself is not installed here)."""
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import datasets
import transformers
import trl
from transformers import set_seed
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer, ModelConfig, TrlParser, get_peft_config

logger = logging.getLogger(__name__)


@dataclass
class GRPOConfig(trl.GRPOConfig):
    system_prompt: Optional[str] = field(default=None, metadata={"help": "The optional system prompt."})
    max_prompt_length: Optional[int] = field(default=512, metadata={"help": "open-r1 keeps TRL's old field."})
    chat_template: Optional[str] = field(default=None, metadata={"help": "The chat template to use."})
    wandb_project: Optional[str] = field(default=None, metadata={"help": "The project to store runs under."})


@dataclass
class GRPOScriptArguments(trl.ScriptArguments):
    reward_funcs: list[str] = field(default_factory=lambda: ["accuracy", "format", "tag_count"])
    cosine_min_value_wrong: float = field(default=0.0)
    cosine_max_value_wrong: float = field(default=-0.5)
    cosine_min_value_correct: float = field(default=0.5)
    cosine_max_value_correct: float = field(default=1.0)
    cosine_max_len: int = field(default=1000)
    repetition_n_grams: int = field(default=3)
    repetition_max_penalty: float = field(default=-1.0)
    dataset_prompt_column: str = field(default="prompt")
    max_completion_len: int = field(default=16384)
    soft_punish_cache: int = field(default=4096)


def format_reward(completions, **kwargs):
    return [1.0 if "</think>" in c[0]["content"] else 0.0 for c in completions]


def tag_count_reward(completions, **kwargs):
    return [0.25 * sum(c[0]["content"].count(t) == 1 for t in ("<think>\n", "\n</think>\n")) for c in completions]


def reasoning_steps_reward(completions, **kwargs):
    return [min(1.0, c[0]["content"].count("Step ") / 3) for c in completions]


def get_reward_funcs(script_args):
    from trl.rewards import accuracy_reward, get_cosine_scaled_reward, get_repetition_penalty_reward
    registry = {
        "accuracy": accuracy_reward,
        "format": format_reward,
        "tag_count": tag_count_reward,
        "reasoning_steps": reasoning_steps_reward,
        "cosine": get_cosine_scaled_reward(
            min_value_wrong=script_args.cosine_min_value_wrong, max_value_wrong=script_args.cosine_max_value_wrong,
            min_value_correct=script_args.cosine_min_value_correct,
            max_value_correct=script_args.cosine_max_value_correct, max_len=script_args.cosine_max_len),
        "repetition_penalty": get_repetition_penalty_reward(
            ngram_size=script_args.repetition_n_grams, max_penalty=script_args.repetition_max_penalty),
    }
    return [registry[name] for name in script_args.reward_funcs]


def main(script_args, training_args, model_args):
    set_seed(training_args.seed)
    logging.basicConfig(handlers=[logging.StreamHandler(sys.stdout)])
    log_level = training_args.get_process_log_level()
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir):
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
    dataset = datasets.load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path, dtype=model_args.dtype, attn_implementation=model_args.attn_implementation)
    reward_funcs = get_reward_funcs(script_args)

    def make_conversation(example, prompt_column: str = script_args.dataset_prompt_column):
        prompt = []
        if training_args.system_prompt is not None:
            prompt.append({"role": "system", "content": training_args.system_prompt})
        prompt.append({"role": "user", "content": example[prompt_column]})
        return {"prompt": prompt}

    dataset = dataset.map(make_conversation)
    for split in dataset:
        if "messages" in dataset[split].column_names:
            dataset[split] = dataset[split].remove_columns("messages")
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_funcs, args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=(dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None),
        peft_config=get_peft_config(model_args), processing_class=tokenizer,
    )
    checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    metrics = train_result.metrics
    metrics["train_samples"] = len(dataset[script_args.dataset_train_split])
    trainer.log_metrics("train", metrics)
    trainer.save_state()
    trainer.model.generation_config.eos_token_id = tokenizer.eos_token_id
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(dataset_name=script_args.dataset_name, tags=["open-r1"])
        trainer.model.config.use_cache = True
        trainer.model.config.save_pretrained(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


if __name__ == "__main__":
    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    main(script_args, training_args, model_args)

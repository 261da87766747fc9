"""A TRL training script of the usual shape: TrlParser reads a YAML (--config) into ScriptArguments,
GRPOConfig and ModelConfig, the reward functions are defined here, LoRA comes from ModelConfig."""
import re

from datasets import load_dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser, get_peft_config

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
BONUS = 0.5


def answer_reward(completions, solution, **kwargs):
    """1 when the <answer> holds the solution."""
    found = [ANSWER.search(c if isinstance(c, str) else c[0]["content"]) for c in completions]
    return [1.0 if m and m.group(1).strip() == str(s) else 0.0 for m, s in zip(found, solution)]


def short_reward(completions, **kwargs):
    return [BONUS if len(str(c)) < 20 else 0.0 for c in completions]


def main(script_args, training_args, model_args):
    dataset = load_dataset(script_args.dataset_name, script_args.dataset_config)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    tokenizer.pad_token = tokenizer.eos_token
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=[answer_reward, short_reward],
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    main(script_args, training_args, model_args)

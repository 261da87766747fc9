"""Mixed precision as the GPU runs it, checked on the CPU's bf16 autocast:

- the reference model's frozen passes run under the policy's autocast, so at step 1 (the same
  weights) the KL term is exactly 0 (it was 2.3e-7 with the reference in float32);
- a micro-batch's logits stay in bf16 for backward: accelerate's prepare converted the prepared
  model's outputs to float32, which kept `[r, K, V]` float32 logits for backward (20 GB at
  8 x 4096 tokens and a 152k vocabulary), and grpo's chunked log-probs then saved nothing.
"""

from __future__ import annotations

import json

import torch
from tiny_runs import FAST

from grpocli.recipe import load_recipe


def test_kl_is_zero_at_the_first_step_under_bf16(tmp_path):
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, "train.steps=1", "train.mixed_precision=bf16", "algorithm.beta=0.1",
                                     f"train.output_dir={out}"]))
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert step["kl"] == 0.0 and step["entropy"] > 0


def test_saved_logits_stay_in_the_autocast_dtype(tmp_path):
    from accelerate import Accelerator

    from grpocli.algorithms.losses import LossNorm
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.parallel import Parallel
    from grpocli.recipe.schema import TinyModel
    from grpocli.trainer.batching import make_micro_batches
    from grpocli.trainer.rollouts import Rollouts
    from grpocli.trainer.step import LossSettings, micro_batch_loss

    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64), tok, 0)
    parallel = Parallel(Accelerator(cpu=True, mixed_precision="bf16"))
    model, _, _, _ = parallel.prepare(model, None, lambda m: (torch.optim.SGD(m.parameters(), lr=0.1), None))
    texts = ["3", "4<|im_end|>", "33", "12345"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    rollouts = Rollouts(rows=[{}], prompt_ids=[tok("1+2=", add_special_tokens=False)["input_ids"]], completion_ids=ids,
                        completions=texts, truncated=torch.zeros(4, dtype=torch.bool), group_size=4)
    (mb,) = make_micro_batches(rollouts, torch.tensor([1.0, -1.0, 0.5, -0.5]), list(range(4)), max_sequences=4)
    vocab = parallel.unwrap(model).config.vocab_size
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        norm = LossNorm(num_sequences=4, num_tokens=mb.num_tokens, max_completion_length=8, num_micro_batches=1)
        settings = LossSettings(loss="dapo", beta=0.0, kl_estimator="k3", temperature=1.0, max_completion_length=8)
        loss, _ = micro_batch_loss(model, mb, (None, None, None), settings, norm)
    logits = [t for t in saved if t.dim() == 3 and t.shape[-1] == vocab]
    assert logits, "no [r, K, V] tensor was saved for backward"
    assert {t.dtype for t in logits} == {torch.bfloat16}, [(tuple(t.shape), t.dtype) for t in logits]
    loss.backward()
    assert all(p.grad is not None for p in parallel.unwrap(model).parameters())


def _changed_share(run, before) -> float:
    """The share of the policy's weights that a run's last checkpoint holds changed."""
    from grpocli.models.files import read_weights

    after = read_weights(sorted((run / "checkpoints").iterdir())[-1])
    changed = sum(int((after[n].float() != t.float()).sum()) for n, t in before.items() if n in after)
    return changed / sum(t.numel() for n, t in before.items() if n in after)


def test_bf16_weights_without_float32_masters_lose_small_updates_and_are_warned_about(tmp_path, capfd):
    """One AdamW step at lr 1e-6: float32 weights (bf16 compute) all move; bf16 weights barely do
    (the update is below their precision), and grpo says so at start."""
    from grpocli.models import load_policy
    from grpocli.trainer.loop import train

    shares = {}
    for dtype, precision in (("float32", "bf16"), ("bfloat16", "bf16")):
        r = load_recipe("quickstart", [*FAST, "train.steps=1", "train.learning_rate=1e-6", f"model.dtype={dtype}",
                                       f"train.mixed_precision={precision}", f"train.output_dir={tmp_path / dtype}",
                                       "algorithm.drop_zero_spread_groups=false"])
        initial = load_policy(r.recipe.model, r.recipe.train.seed).state_dict()
        before = {n: t.detach().clone() for n, t in initial.items()}
        capfd.readouterr()
        train(r)
        err = capfd.readouterr().err
        assert ("no float32 master copy" in err) == (dtype == "bfloat16"), err[-2000:]
        shares[dtype] = _changed_share(tmp_path / dtype, before)
    assert shares["float32"] > 0.9 and shares["bfloat16"] < 0.2, shares


def test_float16_weights_with_fp16_mixed_precision_are_refused():
    from grpocli.errors import UserError
    from grpocli.trainer.preflight import _check_combinations

    r = load_recipe("quickstart", ["model.dtype=float16", "train.mixed_precision=fp16"]).recipe
    try:
        _check_combinations(r)
    except UserError as err:
        assert err.where == "model.dtype" and "model.dtype=float32" in err.hint
    else:
        raise AssertionError("float16 weights under fp16 mixed precision were accepted")


def test_a_skipped_fp16_step_updates_the_loss_scaler():
    """torch's GradScaler (on the CPU here; CUDA's under fp16 on a GPU): a non-finite step must still
    go through the scaler, which skips it and lowers its scale; skipping it here left the scaler's
    unscale record in place and the next step raised "unscale_() has already been called"."""
    from accelerate import Accelerator

    from grpocli.parallel import Parallel

    acc = Accelerator(cpu=True, mixed_precision="fp16")
    acc.native_amp, acc.scaler = True, torch.amp.GradScaler("cpu", init_scale=2.0**16)  # as on a GPU
    parallel = Parallel(acc)
    model = torch.nn.Linear(2, 1)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    norms = []
    for k in range(3):
        acc.backward(model(torch.ones(1, 2)).sum() * (float("inf") if k == 0 else 1.0))
        norm = parallel.clip_grad_norm(model, 1.0)
        norms.append(norm)
        parallel.step(opt, finite=norm == norm and norm != float("inf"))
    assert norms[0] != norms[0] or norms[0] == float("inf")   # the first step overflowed
    assert acc.scaler.get_scale() < 2.0**16                   # ... and the scaler lowered its scale
    assert not torch.equal(parallel.unwrap(model).weight, before)  # the finite steps trained

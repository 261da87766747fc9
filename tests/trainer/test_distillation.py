"""On-policy distillation ([distill]): the per-token signal against hand-computed numbers and TRL 1.16's own
distillation losses, and real runs of the command line with a teacher (docs/distillation.md)."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from cli_runner import grpo_in_process
from tiny_runs import FAST

from grpocli.algorithms.packing import Layout
from grpocli.parallel import Parallel
from grpocli.recipe import load_recipe
from grpocli.trainer.batching import optimizer_batches
from grpocli.trainer.rollouts import Rollouts, Scored, compute_advantages
from grpocli.trainer.step import Frozen, LossSettings, optimizer_step

TOL = 1e-6


def _step(logp: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, rewards: list[float], overrides: list[str],
          old: torch.Tensor | None = None) -> tuple[dict[str, float], torch.Tensor]:
    """One real optimizer step of grpo's (batching, normalisers, loss) on given log-probs `[N, T]` (a leaf whose
    gradient is returned), one group of N completions; the teacher's log-probs come from the frozen pass."""
    n, t = logp.shape
    recipe = load_recipe("quickstart", [f"generation.num_generations={n}", "train.prompts_per_step=1",
                                        f"generation.max_completion_length={t}", "distill.teacher=teacher-dir",
                                        *overrides]).recipe
    lengths = [int(m) for m in mask.sum(-1).tolist()]
    rollouts = Rollouts(rows=[{"prompt": "p"}], prompt_ids=[[1, 2]], completion_ids=[[5] * k for k in lengths],
                        completions=[""] * n, truncated=torch.zeros(n, dtype=torch.bool), group_size=n)
    scored = Scored(rollouts, torch.tensor(rewards), per_reward={})
    parallel = Parallel(Accelerator(cpu=True))
    settings = LossSettings.of(recipe.algorithm, recipe.generation, recipe.distill)
    advantages = compute_advantages(parallel, scored, recipe.algorithm, reward_fns=[], max_completion_length=t,
                                    keep_flat=settings.distill == "reverse_kl")  # as the loop computes them
    ((_, _, batch),) = optimizer_batches(parallel, scored, advantages, algorithm=recipe.algorithm, train=recipe.train,
                                         zero_advantage_rows_matter=settings.zero_advantage_rows_matter,
                                         layout=Layout("padded"))
    leaf = logp.clone().double().requires_grad_(True)
    cut = [(mb.index, mb.loss_mask.shape[1]) for mb in batch.micro_batches]
    frozen = Frozen(old_logp=None if old is None else tuple(old.double()[i, :w] for i, w in cut),
                    teacher_logp=tuple(teacher.double()[i, :w] for i, w in cut))

    def forward(model, mb, temperature, **_):
        width = mb.loss_mask.shape[1]
        return leaf[mb.index, :width] * mb.loss_mask, torch.zeros(mb.loss_mask.shape, dtype=torch.float64)

    model = torch.nn.Linear(1, 1)
    stats = optimizer_step(parallel, model, torch.optim.SGD(model.parameters(), lr=0.0), batch, frozen, settings,
                           max_grad_norm=0.0, forward=forward)
    return stats, leaf.grad


def test_reverse_kl_advantage_per_token_is_coef_times_teacher_minus_student_by_hand():
    """Two completions (3 and 2 tokens), equal rewards (a flat group: no reward advantage at all). The
    advantage of each token is coef (teacher - student); dapo's loss is -sum(A) / tokens at ratio 1 and its
    gradient with respect to each log-prob is -A_t / tokens."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0]])
    teacher = torch.tensor([[-0.5, -2.5, -0.5], [-1.2, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    stats, grad = _step(logp, teacher, mask, [1.0, 1.0], ["distill.coef=0.5", "algorithm.loss=dapo"])
    # A = 0.5 x (teacher - logp): [0.25, -0.25, 0], [-0.5, 1.0, -]; 5 tokens
    want_grad = -torch.tensor([[0.25, -0.25, 0.0], [-0.5, 1.0, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=TOL)
    assert stats["loss"] == pytest.approx(-(0.25 - 0.25 + 0.0 - 0.5 + 1.0) / 5, abs=TOL)
    # the sampled reverse KL, student - teacher, summed over the loss tokens: 0.5 * (-0.5 - 0 + ...) / 0.5
    assert stats["teacher_kl"] == pytest.approx((-0.5 + 0.5 + 0.0 + 1.0 - 2.0), abs=TOL)
    assert stats["skipped"] == 0.0  # a flat group still learns from the teacher


def test_reverse_kl_uses_the_sampling_policys_log_probs_and_the_clip():
    """With the policy moved since sampling (old != current), the advantage is taken at the sampling policy
    (Thinking Machines: sampling log-probs), and the ratio and its clip apply as in GRPO."""
    old = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    logp = torch.tensor([[-0.5, -2.0], [-1.0, -1.0]])  # ratio e^0.5 = 1.65 on token 0 (clipped at 1.2 where A > 0)
    teacher = torch.tensor([[-0.2, -3.0], [-1.0, -1.0]])  # A = [0.8, -1.0], [0, 0]
    _, grad = _step(logp, teacher, torch.ones(2, 2), [0.0, 0.0], ["algorithm.loss=dapo", "algorithm.epsilon_high=0.2"],
                    old=old)
    # token 0: clipped (A > 0, ratio above 1.2): no gradient; token 1: -A x ratio (d ratio / d logp = ratio) / 4
    want = torch.tensor([[0.0, 1.0 / 4], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, want, rtol=0, atol=TOL)


def test_reward_plus_kl_adds_coef_times_the_k2_term_to_the_reward_loss():
    """objective 'reward_plus_kl': the reward advantages as GRPO computes them, plus coef x k2(student,
    teacher) = coef (logp - teacher)^2 / 2 per token, under the loss's aggregation."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    teacher = torch.tensor([[-1.5, -2.0], [-0.5, -0.5]])
    mask = torch.ones(2, 2)
    overrides = ["distill.objective=reward_plus_kl", "distill.coef=0.3", "algorithm.loss=dapo",
                 "algorithm.advantage_scale=none"]
    stats, grad = _step(logp, teacher, mask, [1.0, 0.0], overrides)
    a = torch.tensor([[0.5], [-0.5]], dtype=torch.float64)  # r - group mean
    d = (logp - teacher).double()
    want_grad = (-a + 0.3 * d) / 4  # d/dlogp of (-ratio A + coef d^2 / 2) / tokens at ratio 1
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=TOL)
    assert stats["loss"] == pytest.approx(float((-a.expand(2, 2) + 0.3 * d ** 2 / 2).sum() / 4), abs=TOL)


def _trl_iw_opd_loss(logits, tokens, labels, teacher, rollout):
    from trl.experimental.iw_opd.iw_opd_trainer import IWOPDTrainer

    self = SimpleNamespace(temperature=1.0, iw_opd_gamma=0.0, iw_opd_epsilon=1e-8,
                           model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list)})
    return IWOPDTrainer._compute_iw_opd_loss(self, logits, tokens, labels, teacher, rollout_logprobs=rollout)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_gradient_is_trls_iw_opd_loss_at_gamma_0(seed):
    """TRL 1.16's IW-OPD (trl.experimental.iw_opd) with iw_opd_gamma = 0 is exactly this objective: advantage
    teacher - rollout log-prob per sampled token, loss -logp x A, token mean. On the student's own samples
    (rollout = current policy) its gradient with respect to the logits is grpo's (distill.objective =
    'reverse_kl', algorithm.loss = 'dapo', coef 1)."""
    g = torch.Generator().manual_seed(seed)
    n, t, v = 3, 5, 7
    logits = torch.randn(n, t, v, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, v, (n, t), generator=g)
    lengths = [5, 3, 4]
    mask = torch.tensor([[1.0] * k + [0.0] * (t - k) for k in lengths], dtype=torch.float64)
    labels = torch.where(mask > 0, tokens, torch.full_like(tokens, -100))
    teacher = torch.log_softmax(torch.randn(n, t, v, generator=g, dtype=torch.float64), -1).gather(
        -1, tokens.unsqueeze(-1)).squeeze(-1)
    rollout = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    theirs = logits.clone().requires_grad_(True)
    _trl_iw_opd_loss(theirs, tokens, labels, teacher, rollout.detach()).backward()

    ours = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(ours, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * mask  # [N, T]
    _, grad_logp = _step(logp.detach(), teacher * mask, mask, [0.0] * n, ["algorithm.loss=dapo"])
    logp.backward(grad_logp)  # chain rule: d loss / d logits = d loss / d logp x d logp / d logits
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=TOL)


def test_the_signals_expectation_is_trls_full_reverse_kl():
    """TRL's DistillationTrainer computes the whole-vocabulary reverse KL (generalized JSD with beta = 1);
    the per-token signal here, student - teacher log-prob of the sampled token, is its one-sample estimate:
    averaged over every token the student could sample, weighted by its probability, it is TRL's number."""
    from trl.experimental.iw_opd.iw_opd_trainer import IWOPDTrainer

    g = torch.Generator().manual_seed(3)
    student = torch.log_softmax(torch.randn(4, 6, generator=g, dtype=torch.float64), -1)  # [positions, V]
    teacher = torch.log_softmax(torch.randn(4, 6, generator=g, dtype=torch.float64), -1)
    trl = IWOPDTrainer.generalized_jsd_loss(student.unsqueeze(0), teacher.unsqueeze(0), beta=1.0,
                                            temperature=1.0, reduction="none")  # per position and token
    trl_per_position = trl.squeeze(0).sum(-1)
    expectation = (student.exp() * (student - teacher)).sum(-1)  # E_{y ~ student}[log p_s(y) - log p_t(y)]
    torch.testing.assert_close(expectation, trl_per_position, rtol=0, atol=TOL)


# -- real runs of the command line ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """Model directories: the student's own starting weights, and a wider model with the same tokenizer."""
    from grpocli.models import load_reference, load_tokenizer, save_model

    recipe = load_recipe("quickstart", list(FAST)).recipe
    tokenizer = load_tokenizer(recipe.model)
    folder = tmp_path_factory.mktemp("teachers")
    same = save_model(load_reference(recipe.model, recipe.train.seed), tokenizer, folder / "same")
    wider = load_recipe("quickstart", [*FAST, "model.tiny.hidden_size=64"]).recipe.model
    other = save_model(load_reference(wider, 5), tokenizer, folder / "other")
    return {"same": same, "other": other}


def _metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(monkeypatch, capsys, run, teacher, *extra: str) -> tuple[int, str]:
    return grpo_in_process(monkeypatch, capsys, "train", "quickstart", *FAST, f"train.output_dir={run}",
                           f"distill.teacher={teacher}", *extra)


def _user_error(code: int, output: str, *needles: str) -> None:
    assert code == 2 and "Traceback" not in output, output[-3000:]
    assert output.count("error: ") == 1, output
    for needle in needles:
        assert needle in output, f"{needle!r} not in:\n{output}"


def test_a_run_learns_from_a_local_teacher_and_its_own_weights_teach_nothing(tmp_path, teachers, monkeypatch,
                                                                              capsys):
    code, output = _train(monkeypatch, capsys, tmp_path / "same", teachers["same"])
    assert code == 0, output[-3000:]
    same = _metrics(tmp_path / "same")
    assert [m["distill/reverse_kl"] for m in same] == [0.0, 0.0]  # the student is its teacher: no signal
    assert [m["grad_norm"] for m in same] == [0.0, 0.0]
    code, output = _train(monkeypatch, capsys, tmp_path / "other", teachers["other"])
    assert code == 0, output[-3000:]
    other = _metrics(tmp_path / "other")
    assert all(m["distill/reverse_kl"] != 0 and m["grad_norm"] > 0 for m in other)
    assert other[0]["loss"] == pytest.approx(other[0]["distill/reverse_kl"], rel=1e-5)  # dapo at ratio 1


def test_a_teacher_with_another_vocabulary_exits_2_naming_both(tmp_path, teachers, monkeypatch, capsys):
    """The tiny tokenizer with a larger vocabulary: the same characters, more ids."""
    import shutil

    from grpocli.models.tokenizer import build_char_tokenizer

    odd = tmp_path / "odd"
    shutil.copytree(teachers["other"], odd)
    build_char_tokenizer(vocab_size=300).save_pretrained(odd)
    code, output = _train(monkeypatch, capsys, tmp_path / "run", odd)
    _user_error(code, output, "distill.teacher", "is not the student's", str(odd), "tiny", "tokens)")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("teacher, needles", [
    ("/nonexistent/teacher", ["distill.teacher", "/nonexistent/teacher", "as a model"]),
    ("http://127.0.0.1:9", ["distill.teacher", "no grpo ref-serve answers at http://127.0.0.1:9"]),
])
def test_a_teacher_that_cannot_be_loaded_or_reached_is_named(tmp_path, teacher, needles, monkeypatch, capsys):
    _user_error(*_train(monkeypatch, capsys, tmp_path / "run", teacher, "distill.timeout=3"), *needles)

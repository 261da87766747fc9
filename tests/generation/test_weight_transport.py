"""Which weight transport the vllm-server backend uses (grpocli.generation.vllm_client.choose_transport):
the one the servers' weight-transfer engine takes (nccl: vLLM's own, on GPUs; gloo: grpo_gloo). A
GRPO_VLLM_WEIGHT_TRANSPORT that names another, or servers started with different engines, is a UserError
before any weight moves: never a broadcast nobody receives."""

from __future__ import annotations

import pytest

from grpocli.errors import UserError
from grpocli.generation.vllm_client import choose_transport


def test_the_servers_engine_decides():
    assert choose_transport(None, {"transports": ["gloo"]}) == "gloo"
    assert choose_transport(None, {"transports": ["nccl"]}) == "nccl"
    assert choose_transport("nccl", {"transports": ["nccl"]}) == "nccl"


def test_asking_for_another_transport_names_the_servers_and_the_flag():
    with pytest.raises(UserError) as err:
        choose_transport("nccl", {"transports": ["gloo"]})
    assert err.value.where == "GRPO_VLLM_WEIGHT_TRANSPORT" and "takes 'gloo', not 'nccl'" in err.value.what
    assert "--weight-transfer nccl" in err.value.hint


def test_a_fleet_of_servers_with_different_engines_is_refused():
    with pytest.raises(UserError, match="different weight-transfer engines"):
        choose_transport(None, {"transports": []})

"""Where the colocated engine's start-up copy of the policy goes (grpocli.generation.engine_copy).

Free space is faked with a ``disk_usage`` stand-in: /dev/shm of Docker's default 64 MB, a full
temporary directory, several processes on one machine. No vLLM needed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpocli.errors import UserError
from grpocli.generation import engine_copy
from grpocli.generation.engine_copy import EXTRA_BYTES, copy_dir, pick_dir, policy_bytes, write_engine_copy
from grpocli.parallel import Parallel

MB = 2**20


@pytest.fixture(scope="module")
def tiny():
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    tokenizer = build_char_tokenizer()
    return build_tiny_model(TinyModel(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
                            tokenizer, 0), tokenizer


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Two real directories standing in for /dev/shm and the temporary directory."""
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    monkeypatch.setattr(engine_copy, "candidate_dirs", lambda: [str(shm), str(tmp)])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return str(shm), str(tmp)


def usage(free: dict[str, int]):
    return lambda path: SimpleNamespace(free=free[path])


def test_policy_bytes_counts_each_parameter_once(tiny):
    model, _ = tiny
    seen = {id(p): p.numel() * p.element_size() for p in model.parameters()}
    assert policy_bytes(model) == sum(seen.values()) > 0


def test_shm_with_room_is_used(tiny, places):
    shm, tmp = places
    got = copy_dir(tiny[0], disk_usage=usage({shm: 10**12, tmp: 10**12}))
    assert got.startswith(shm + "/grpo-vllm-")


def test_dockers_64mb_shm_falls_back_to_the_temporary_directory(tiny, places):
    shm, tmp = places
    got = copy_dir(tiny[0], disk_usage=usage({shm: 64 * MB, tmp: 10**12}))
    assert got.startswith(tmp + "/grpo-vllm-")


def test_every_process_on_the_machine_needs_room(tiny, places, monkeypatch):
    """8 processes write a copy each at once: room for one is not enough."""
    shm, tmp = places
    one = policy_bytes(tiny[0]) + EXTRA_BYTES
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert copy_dir(tiny[0], disk_usage=usage({shm: one * 2, tmp: one * 8})).startswith(tmp)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert copy_dir(tiny[0], disk_usage=usage({shm: one * 2, tmp: one * 8})).startswith(shm)


def test_no_room_anywhere_is_a_user_error_naming_the_sizes(tiny, places):
    shm, tmp = places
    with pytest.raises(UserError) as err:
        copy_dir(tiny[0], disk_usage=usage({shm: 1 * MB, tmp: 2 * MB}))
    text = str(err.value)
    assert "start-up copy" in text and f"{shm} has 0.00 GB free" in text and f"{tmp} has 0.00 GB free" in text
    assert "--shm-size" in text and "TMPDIR" in text and err.value.exit_code == 2


class OtherProcessLacksRoom(Parallel):
    """Two processes; the other found no room anywhere (its answer is the worst: 2 places -> index 2)."""

    def __init__(self) -> None:
        super().__init__(None)

    def fewest(self, count: int) -> int:
        return min(count, -2)


def test_the_processes_agree_so_none_stops_alone(tiny, places):
    shm, tmp = places
    with pytest.raises(UserError):
        copy_dir(tiny[0], OtherProcessLacksRoom(), disk_usage=usage({shm: 10**12, tmp: 10**12}))


def test_pick_dir_is_the_first_with_room():
    free = {"a": 5, "b": 10}.__getitem__
    assert pick_dir(5, ["a", "b"], free) == 0 and pick_dir(6, ["a", "b"], free) == 1
    assert pick_dir(11, ["a", "b"], free) == 2 and pick_dir(1, [], free) == 0


def test_write_engine_copy_refuses_a_full_directory_before_writing(tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(UserError) as err:
        write_engine_copy(model, tokenizer, tmp_path, disk_usage=usage({str(tmp_path): 10 * MB}))
    assert "needs" in str(err.value) and str(tmp_path) in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_write_engine_copy_writes_a_checkpoint(tiny, tmp_path):
    model, tokenizer = tiny
    out = write_engine_copy(model, tokenizer, tmp_path)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "model.safetensors").stat().st_size <= policy_bytes(model) + MB

"""Datasets from the Hugging Face Hub, through ``datasets.load_dataset``, failing fast offline.

Without a network huggingface_hub retries each request with backoff (about 25 s before it
gives up); a one-socket probe of the endpoint first turns that into an immediate error. With
``HF_HUB_OFFLINE=1`` the probe is skipped and `datasets` reads its cache, as it documents.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from grpocli.errors import UserError

if TYPE_CHECKING:
    import datasets

PROBE_TIMEOUT_S = 3.0
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
GSM8K_ID = "openai/gsm8k"


def load_hub(
    split: str, seed: int, *, id: str, name: str | None = None, **load_args: Any
) -> datasets.Dataset:
    """``datasets.load_dataset(id, name, split=split, **load_args)``, errors users can act on."""
    import datasets

    offline = bool(datasets.config.HF_HUB_OFFLINE)
    if not offline and not hub_reachable():
        raise _unreachable(id, name, "no connection to the hub")
    try:
        return datasets.load_dataset(id, name, split=split, **load_args)
    except ConnectionError as exc:
        raise _unreachable(id, name, "HF_HUB_OFFLINE is set" if offline else str(exc)) from None
    except datasets.exceptions.DatasetNotFoundError as exc:
        raise UserError(
            f"hub dataset {id!r} was not found ({exc})",
            where="data.dataset",
            hint="check the id at https://huggingface.co/datasets, or log in for a gated one "
            "(`hf auth login`)",
        ) from None


def load_gsm8k(
    split: str, seed: int, *, id: str = GSM8K_ID, name: str = "main"
) -> datasets.Dataset:
    """GSM8K (Cobbe et al., 2021): ``question`` -> prompt, the number after ``####`` -> answer."""
    ds = load_hub(split, seed, id=id, name=name)
    return ds.map(gsm8k_row, remove_columns=ds.column_names)


def gsm8k_row(row: dict[str, Any]) -> dict[str, str]:
    """One GSM8K row as {prompt, answer (the final number, commas removed), solution}."""
    _, _, final = row["answer"].rpartition("####")
    return {
        "prompt": row["question"],
        "answer": final.strip().replace(",", ""),
        "solution": row["answer"],
    }


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub endpoint opens (True behind a proxy: not probed)."""
    from huggingface_hub import constants

    if any(os.environ.get(v) for v in PROXY_VARIABLES):
        return True
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _unreachable(id: str, name: str | None, why: str) -> UserError:
    config = f", {name!r}" if name else ""
    export = (
        f"import datasets; d = datasets.load_dataset({id!r}{config}); "
        "[d[s].to_json(f'{s}.jsonl') for s in d]"
    )
    return UserError(
        f"cannot load hub dataset {id!r}: the Hugging Face Hub cannot be reached ({why})",
        where="data.dataset",
        valid="a registered dataset name (`grpo inspect plugins`) or a local "
        ".jsonl/.json/.parquet/.csv file",
        hint=f'on a machine with access run: python -c "{export}", copy the files here and '
        'set data.dataset = "path/to/{split}.jsonl" (or set HF_HUB_OFFLINE=1 to use a copy '
        "already in the datasets cache)",
    )

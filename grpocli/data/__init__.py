"""Prompts: dataset sources (procedural, local files, hub ids), templating, order, curricula.

    source.py              ``data.dataset`` (or a [[data.sources]] source) resolved to a loader; one split loaded
    builtin.py             the built-in dataset loaders, registered through the plugin hook
    generators.py          procedural datasets: seeded, offline, pure Python
    files.py               local .jsonl / .json / .parquet / .csv files through `datasets`' builders
    defects.py             a local file's defects, named by file and line
    saved.py               folders written by `datasets`' ``save_to_disk``
    hub.py                 Hugging Face Hub datasets, failing fast offline
    verifiers_datasets.py  verifiers environments loaded once per (id, args); their datasets
    columns.py             every row of a loaded split checked as it loads
    template.py            prompts as the model sees them: messages, then the chat template
    stream.py              the order prompts are drawn in: epoch after epoch, each shuffled by (seed, epoch)
    mixture.py             the order prompts are drawn in from [[data.sources]]: by weight, seeded, resumable
    curricula.py           built-in curricula: the next prompts picked from how the last ones scored

Light on purpose: `datasets` and `transformers` are imported inside the functions that need them.
"""

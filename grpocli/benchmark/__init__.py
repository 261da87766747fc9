"""`grpo bench`: a few real steps of a recipe, measured (phases, tokens/s, FLOPs and MFU against the
device's measured matmul peak, peak memory), a forecast of the whole run's wall time, and the
side-by-side comparison with TRL's GRPOTrainer in fresh, alternating processes (`--vs-trl`).

    flops.py        FLOPs of the passes a step makes, from the model's exact shape (grpo plan's) and token counts
    peak.py         the device's matmul peak, measured (a short timed matmul at the training dtype)
    measurement.py  N steps of a recipe in this process, each phase clocked (the trainer's own Loop, observed)
    processes.py    train.num_processes > 1: the processes `grpo train` would start, each measuring; rank 0's result back
    forecast.py     the whole recipe's wall time from the measured steps, corrected for lengths
    report.py       the figures as text and as one JSON line
    workers.py      one side of a comparison (grpo or TRL) in a fresh process: `python -m ...workers`
    vs_trl.py       the alternating trials and their ratio
    presets.py      real models' shapes (Qwen2.5 0.5B / 1.5B) as `model.tiny.*` overrides
"""

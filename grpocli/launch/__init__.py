"""Starting a run's processes and living with them, above the training step:

    launcher.py   `grpo train`: train in this process, or start n data-parallel ones (torchrun)
    request.py    what an `accelerate launch` around this process asked for; the run's mixed precision
    processes.py  the launcher's processes: they die together and say a user error once
    lock.py       one `grpo train` writes to a run directory at a time
"""

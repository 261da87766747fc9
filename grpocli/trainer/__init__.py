"""The GRPO step (Accelerate): the loop, its phases' values, batching, checkpoints and resume.

    loop.py            the training loop, read top to bottom: numbered phases, one generation cycle at a time
    rollouts.py        what one cycle hands from phase to phase (Rollouts, Scored, Advantages)
    refill.py          one more round for groups that failed rewards left with < 2 scored samples
    observer.py        StepObserver and StepRecord: what the loop tells an observer (grpo bench) of each step
    batching.py        micro-batches of the sequences that enter the loss
    step.py            one optimizer step: every micro-batch's loss, backward, clip, update; the frozen passes
    loss.py            one micro-batch's loss: the named objective, KL, distillation, aggregation, its figures
    split_passes.py    train.sequence_parallel: a split's processes run each one's micro-batches together
    mismatch.py        engine log-probs into the loss: importance weights and their metrics
    offloading.py      activation offloading: saved tensors in host memory
    memory_budget.py   train.memory_limit: what a pass may take (a CPU's resident set, a GPU's allocations)
    resizing.py        an out-of-memory: the micro-batches halved and the step redone
    autofit.py         the "auto" sizes chosen before the model loads, checked at the first step
    prefetch.py        asynchronous generation (generation.async_steps)
    pipeline.py        in-flight generation (generation.pipeline = "inflight"): pacing, the first complete groups
    metrics.py         a step's metrics.jsonl line, what it shows, rollouts files
    completion_log.py  live completions (log.completions_to_print)
    checkpoint.py      checkpoints that are complete or absent; resume that continues exactly
    guard.py           train.guard: after each step, a NaN, KL or entropy trip, and skip, rollback or stop
    rollback.py        a guard rollback: back to a checkpoint as a resume would, the undone steps kept aside
    session.py         `Session`: everything the loop needs, opened in an order that fails early
    teacher.py         [distill]'s teacher: loaded or connected to, its vocabulary checked against the student's
    preflight.py       checks that need no model (names, rewards, tools, positions), before any loads
    source_checks.py   [[data.sources]] checked before any model loads, each source named
    signals.py         SIGTERM and SIGINT: stop cleanly and say what was kept
"""

"""The reference model on its own server: `grpo ref-serve` and the trainer's client for it.

With ``algorithm.reference = "server"`` the training processes load no reference model; phase 5 of
the loop asks a `grpo ref-serve` process for the reference log-probs of each slice's sequences,
and ``ref_sync_steps`` sends it the policy's weights, which it mixes into its own (the server
keeps the only copy of the reference weights; the trainer keeps none).

mixing.py   ref = alpha * policy + (1 - alpha) * ref over each tensor once (tied ones too): the
            in-process refresh and the server's use the same function
host.py     the server's model on one thread: log-prob batches under a token budget, weight updates
            (mixes) that stream in bucket by bucket, timeouts, health
worker.py   the one thread the host runs its model's jobs on, in order: deadlines, stuck detection, health
app.py      the HTTP routes (FastAPI + uvicorn), the API key; run_server(), which the CLI calls
client.py   the trainer's side: a slice's reference log-probs, a refresh, saving / restoring the weights
            for checkpoints; through grpocli.wire.client (the protocol: grpocli/wire/reference.py)

Nothing here imports vLLM: the server needs transformers and torch (and fastapi + uvicorn).
"""

"""Bytes per process in each phase of a step, from the model's shape and the run's settings.

Plain functions returning immutable `Phase` values (named byte counts). What they count is what
grpo's step allocates (grpocli.trainer.step, grpocli.algorithms.logprobs, transformers' decoder
layers under sdpa, grpocli.parallel.sequence's split):

* resident: the policy's weights, gradients (training only: `zero_grad(set_to_none=True)` after
  each step), AdamW's two moments per trained parameter (in the parameter's dtype), an in-process
  reference (algorithm.beta > 0), an in-process distillation teacher ([distill]; in model.dtype, as the
  reference: no gradient, no optimizer state; whole on every process), DDP's gradient buckets, a colocated engine's memory share;
  FSDP2 / ZeRO-3 divide weights, gradients and moments by the processes and gather the root
  (embeddings, final norm) and a decoder layer or two at a time;
* activations saved for backward, per token of a micro-batch's rows, per decoder layer: its input
  and the attention residual, each RMSNorm's normalised value and output, q/k/v, rotary halves and
  results, the attention output twice (sdpa's and the contiguous copy), the MLP's gate, up,
  activation and product; a 4D mask's copy in the compute dtype per layer (sdpa converts the bool
  mask at each call and keeps the result), the bool mask itself through the forward (to backward
  under gradient checkpointing, whose recomputation keeps it); with gradient checkpointing only each
  layer's input plus one layer recomputed; with activation offloading only what the output head
  saves (the rest is in host memory) plus one layer's tensors back in its backward;
* the log-prob tail: logits `[rows, scored, V]` in the compute dtype, their gradient, and float32
  blocks of `chunk_tokens` positions (train.logits_chunk_tokens; grpocli.algorithms.logprobs);
* train.sequence_parallel = N (Ulysses): each process holds 1/N of every row's tokens (the row padded to
  a multiple of N) through every layer and the logits of the scored positions in its slice; attention
  holds every token for 1/N of the heads (as many elements as its own tokens for every head, so q/k/v,
  the output and the logsumexp count per local token too), beside the all-to-all buffers, under the
  whole rows' mask where one is passed (shared-prompt rows, eager attention), which does not divide.

The peak of the training phase is the largest of these moments: the end of the forward (every
activation, the bool mask, the logits and the entropy's blocks), the start of backward (every
activation, logits and their gradient; gradients of earlier micro-batches), a decoder layer's
backward (its recomputed activations and gradient temporaries), the optimizer step (every gradient),
and, under a split, the building of the whole rows' mask. tests/planning/test_measured.py and
tests/planning/test_measured_long.py (8K-token completions, a split over two processes) check these
against torch's own tracking of tensor allocations (MemTracker).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from grpocli.planning.shapes import ModelShape

#: Float32 bytes: the norm's internals, log-softmax blocks, AdamW moments of float32 weights.
F32 = 4
#: Hidden-sized tensors a decoder layer saves for backward: its input, each RMSNorm's normalised
#: value and output (the q/k/v and gate/up projections read that output), the attention output o_proj
#: reads, the attention residual. (rotary's cos/sin need no q or k: they do not require grad.)
HIDDEN_SAVED = 6
#: sdpa keeps q and its output (query-sized), k and v (key-sized; with a mask, repeated to every query head).
Q_SAVED, KV_SAVED = 2, 2
#: The MLP's gate, up, act(gate) and act(gate) * up.
MLP_SAVED = 4
#: Gradient temporaries while a decoder layer runs backward: MLP-wide and hidden-wide tensors.
MLP_GRAD_TEMPS, HIDDEN_GRAD_TEMPS = 1, 2
#: Float32 blocks of `chunk_tokens` positions alive at once in grpocli.algorithms.logprobs (MemTracker on a
#: CPU): the log-probs' upcast block, the entropy's (the training forward's metric) upcast block and
#: log-softmax, the backward's block beside the gradient of the logits; where the logits take more than one
#: block, one more each (the previous block is still held while the next is made).
LOGPROB_BLOCKS, ENTROPY_BLOCKS, BACKWARD_BLOCKS = 1, 2, 1
#: Under a sequence split: all-to-all buffers (send and receive) per exchanged q/k/v/output element.
EXCHANGE_BUFFERS = 2
#: Under a sequence split: bool masks of the whole rows alive at once while grpocli.parallel.sequence.whole_mask
#: builds the split's mask (the causal one, its product with the rows' padding, the diagonal, the result).
MASK_BUILD = 4
#: FSDP2 / ZeRO-3 decoder layers whose parameters are gathered at once (the current and the prefetched one).
GATHERED_LAYERS = 2


@dataclass(frozen=True)
class Tokens:
    """The shape of one micro-batch's forward pass."""

    rows: int            # rows of the pass
    width: int           # tokens per row (padding included)
    scored: int          # positions whose logits are computed, all rows together
    mask: int = 0        # elements of the 4D attention mask (shared rows; padded rows, more than one, under sdpa;
                         # under a split: shared rows or eager, the whole rows' on every process); sdpa keeps a copy
                         # in the compute dtype per layer
    split: int = 1       # train.sequence_parallel: processes that each hold 1/split of every row's tokens

    @property
    def tokens(self) -> int:
        return self.rows * self.width

    @property
    def local(self) -> int:
        """Tokens one process holds through the layers: its 1/split of each row (padded to a multiple of split)."""
        return self.rows * -(-self.width // self.split)

    @property
    def local_scored(self) -> int:
        """Positions whose logits one process computes: at most its slice of every row (the last slice's, where
        the completions are)."""
        return min(self.scored, self.local)


@dataclass(frozen=True)
class Settings:
    """How the run holds the model (from the recipe and `grpo plan`'s options; grpocli.planning.plan)."""

    weight_bytes: int = 4                 # model.dtype
    compute_bytes: int = 4                # the dtype activations are computed in (autocast's under mixed precision)
    lora_params: int = 0                  # trained LoRA parameters (0: every weight is trained)
    lora_rank: int = 0
    lora_linears: int = 0                 # adapted linear layers per decoder layer
    gradient_checkpointing: bool = False
    activation_offloading: bool = False
    reference: bool = False               # an in-process reference model (algorithm.beta > 0, not a server)
    teacher: ModelShape | None = None     # an in-process distillation teacher (distill.teacher, not a server URL)
    teacher_bytes: int = 0                # bytes per teacher weight (model.dtype, as the reference's)
    processes: int = 1
    sharding: str = "none"                # none (DDP), fsdp2, zero2, zero3
    micro_batches: int = 1                # micro-batches per optimizer step on a process
    train: Tokens = Tokens(1, 1, 1)       # the largest training micro-batch
    logprob: Tokens = Tokens(1, 1, 1)     # the largest no-grad log-prob pass
    chunk_tokens: int = 1024
    entropy_grad: bool = False            # algorithm.entropy_coef > 0: a float32 softmax of every position kept
    engine_bytes: int = 0                 # a colocated vLLM engine's share (weights, KV cache, its activations)
    engine_sleeps: bool = False           # vllm.sleep_mode > 0: the engine gives its share back while training
    generation_bytes: int = 0             # the 'hf' backend's KV cache and logits while it generates

    @property
    def sequence_parallel(self) -> int:
        """train.sequence_parallel: the processes each training and log-prob row is split over."""
        return self.train.split

    @property
    def mixed_precision(self) -> bool:
        """Autocast over float32 weights: float32 residual stream, cast copies of every weight."""
        return self.weight_bytes == F32 and self.compute_bytes < F32

    @property
    def trainable_bytes(self) -> int:
        """Bytes per trained parameter of its gradient and each AdamW moment (LoRA adapters: float32)."""
        return F32 if self.lora_params else self.weight_bytes


@dataclass(frozen=True)
class Phase:
    """One phase of a step: what it holds, by name, in bytes per process."""

    name: str
    parts: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    @property
    def total(self) -> int:
        return sum(b for _, b in self.parts)

    def get(self, name: str) -> int:
        return sum(b for n, b in self.parts if n == name)


def _share(count: int, s: Settings, sharded: tuple[str, ...]) -> int:
    """`count` divided over the processes when the sharding splits it (ceil: shards are padded)."""
    return -(-count // s.processes) if s.sharding in sharded else count


def resident(shape: ModelShape, s: Settings, *, training: bool, generating: bool = False) -> list[tuple[str, int]]:
    """What stays on the device through the phase: weights, (gradients), optimizer, reference, engine
    (asleep outside generation with vllm.sleep_mode)."""
    trained = s.lora_params or shape.params
    weights = _share(shape.params, s, ("fsdp2", "zero3")) * s.weight_bytes
    parts = [("policy weights", weights)]
    if s.lora_params:
        parts.append(("LoRA adapters", _share(s.lora_params, s, ("fsdp2", "zero3")) * F32))
    if s.sharding in ("fsdp2", "zero3") and s.processes > 1 and training:
        whole = shape.root_params + GATHERED_LAYERS * shape.layer_params
        parts.append(("gathered layers (FSDP2/ZeRO-3)", whole * (s.compute_bytes if s.mixed_precision else s.weight_bytes)))
    if training:
        parts.append(("gradients", _share(trained, s, ("fsdp2", "zero2", "zero3")) * s.trainable_bytes))
        if s.sharding == "none" and s.processes > 1:
            parts.append(("DDP gradient buckets", trained * s.trainable_bytes))
    parts.append(("optimizer state (AdamW)", 2 * _share(trained, s, ("fsdp2", "zero2", "zero3")) * s.trainable_bytes))
    if s.sharding == "zero2" and s.weight_bytes < F32:
        parts.append(("float32 master weights (ZeRO)", _share(trained, s, ("zero2",)) * F32))
    if s.reference:
        parts.append(("reference weights", _share(shape.params, s, ("fsdp2", "zero3")) * s.weight_bytes))
    if s.teacher is not None:  # whole on every process: grpocli.trainer.teacher does not shard it
        parts.append(("teacher weights", s.teacher.params * s.teacher_bytes))
    if s.engine_bytes and (generating or not s.engine_sleeps):
        parts.append(("vLLM engine share", s.engine_bytes))
    if s.mixed_precision and training:  # autocast keeps a compute-dtype copy of every weight it casts
        parts.append(("autocast weight copies", _share(shape.params, s, ("fsdp2", "zero3")) * s.compute_bytes))
    return parts


def layer_bytes(shape: ModelShape, s: Settings, t: Tokens) -> int:
    """Activation bytes one decoder layer saves for backward over the micro-batch `t` (module docstring)."""
    h, cb = shape.hidden_size, s.compute_bytes
    rb = F32 if s.mixed_precision else cb            # the residual stream's bytes
    q = shape.num_heads * shape.head_dim
    kv = q if t.mask else shape.num_kv_heads * shape.head_dim  # sdpa with a mask: k, v repeated to every head
    per_token = HIDDEN_SAVED * h * rb + cb * (Q_SAVED * q + KV_SAVED * kv + MLP_SAVED * shape.intermediate_size)
    per_token += F32 * (2 + shape.num_heads)          # the norms' rsqrt, sdpa's logsumexp
    # (under a sequence split attention holds every token for 1/split of the heads: as many elements as its
    # own tokens for every head, so q/k/v, the output and the logsumexp count per local token too)
    if s.weight_bytes < F32:                          # half weights: each norm keeps a float32 copy of its input
        per_token += 2 * F32 * h
    if s.mixed_precision:                             # autocast's copies of what q/k/v, gate/up and o_proj read
        per_token += 3 * h * cb
    if s.lora_params:                                 # lora_A's outputs, kept for lora_B
        per_token += F32 * s.lora_rank * s.lora_linears
    return per_token * t.local + t.mask * cb


def exchange_bytes(shape: ModelShape, s: Settings, t: Tokens) -> int:
    """Under a sequence split, the all-to-all buffers beside a layer's attention (grpocli.parallel.ulysses):
    the send and receive copies of q, k, v and the output (or their gradients), about twice their local size."""
    if t.split <= 1:
        return 0
    local = (2 * shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim * t.local * s.compute_bytes
    return EXCHANGE_BUFFERS * local


def head_input_bytes(shape: ModelShape, s: Settings, t: Tokens) -> int:
    """The hidden states the lm_head reads at the scored positions (saved for backward)."""
    return t.local_scored * shape.hidden_size * s.compute_bytes


def root_bytes(shape: ModelShape, s: Settings, t: Tokens) -> int:
    """Saved outside the decoder layers: the final norm, the ids, rotary's cos/sin, the hidden states
    the lm_head reads at the scored positions."""
    rb = F32 if s.mixed_precision else s.compute_bytes
    norm = t.local * (2 * shape.hidden_size * rb + F32 + 8)
    rotary = 2 * t.local * shape.head_dim * s.compute_bytes  # cos and sin of every row's positions
    return norm + rotary + head_input_bytes(shape, s, t)


def _logits(shape: ModelShape, s: Settings, t: Tokens, compute_bytes: int | None = None) -> tuple[int, int, int]:
    """(logits of the scored positions, one float32 block of the chunked log-softmax, 1 where there are more
    blocks than one: the blocks held at once beyond LOGPROB_BLOCKS, ENTROPY_BLOCKS, BACKWARD_BLOCKS)."""
    logits = t.local_scored * shape.vocab_size * (compute_bytes or s.compute_bytes)
    block = min(s.chunk_tokens, t.local_scored) * shape.vocab_size * F32
    return logits, block, int(t.local_scored > s.chunk_tokens)


def training_phase(shape: ModelShape, s: Settings) -> Phase:
    """Forward, backward and the optimizer step of the largest micro-batch."""
    t = s.train
    h, rb = shape.hidden_size, F32 if s.mixed_precision else s.compute_bytes
    per_layer = layer_bytes(shape, s, t)
    layer_input = h * rb * t.local
    # the bool 4D mask lives through the forward; a checkpointed layer's recomputation keeps it to backward
    mask = t.mask
    if s.gradient_checkpointing:  # each layer's input (the checkpoint's) and, outside, what is not offloaded
        saved = shape.num_layers * layer_input + mask + (head_input_bytes(shape, s, t) if s.activation_offloading
                                                          else root_bytes(shape, s, t))
        mask = 0
    elif s.activation_offloading:  # everything saved before the output head is in host memory
        saved = head_input_bytes(shape, s, t)
    else:
        saved = shape.num_layers * per_layer + root_bytes(shape, s, t)
    logits, block, more = _logits(shape, s, t)
    entropy = 2 * t.local_scored * shape.vocab_size * F32 if s.entropy_grad else 0  # a float32 softmax, kept
    grad_temps = t.local * (MLP_GRAD_TEMPS * shape.intermediate_size * s.compute_bytes + HIDDEN_GRAD_TEMPS * h * rb)
    grad_temps += exchange_bytes(shape, s, t)
    back = per_layer if (s.gradient_checkpointing or s.activation_offloading) else 0  # recomputed, or from host
    parts = resident(shape, s, training=True)
    grads = dict(parts)["gradients"]
    parts = [p for p in parts if p[0] != "gradients"]
    passes = s.micro_batches * t.split                # a split runs every process's micro-batches on each
    earlier = grads if passes > 1 else 0              # gradients of the passes before this one
    root_grad = 0 if s.lora_params else min(grads, shape.embedding_params * s.trainable_bytes)
    moments = {  # (gradients, activations, logits and their working memory) at each moment
        "the split's mask is built": (earlier, MASK_BUILD * t.mask if t.split > 1 else 0, 0),
        "forward ends": (earlier, saved + mask, logits + (ENTROPY_BLOCKS + more) * block + entropy),
        "backward starts": (earlier, saved, 2 * logits + (BACKWARD_BLOCKS + more) * block + entropy),
        "a layer's backward": (max(earlier, root_grad), saved + back + grad_temps, 0),
        "optimizer step": (grads, 0, 0),
    }
    g, activations, tail = max(moments.values(), key=sum)
    parts.append(("gradients", g))
    parts.append(("activations" + (" (checkpointed)" if s.gradient_checkpointing else ""), activations))
    parts.append(("logits and log-prob blocks", tail))
    return Phase("training", tuple(parts))


def logprob_phase(shape: ModelShape, s: Settings) -> Phase:
    """A no-grad log-prob pass (old policy, reference, teacher) of the largest log-prob micro-batch: nothing
    is kept for backward, so the peak is a decoder layer's working tensors or, later, the logits and one
    float32 block of the chunked log-softmax, whichever is larger, of the largest model that runs one (the
    passes run one after another)."""
    models = [(shape, s.compute_bytes, "")]
    if s.teacher is not None:  # under autocast in its compute dtype, else in its own
        models.append((s.teacher, s.compute_bytes if s.compute_bytes != s.weight_bytes else s.teacher_bytes,
                       "teacher's "))
    parts = resident(shape, s, training=False)
    if s.sharding in ("fsdp2", "zero3") and s.processes > 1:
        parts.append(("gathered layers (FSDP2/ZeRO-3)", (shape.root_params + GATHERED_LAYERS * shape.layer_params)
                      * s.weight_bytes))
    passes = []
    for m, cb, prefix in models:
        name, size = _no_grad_pass(m, s, cb)
        passes.append((prefix + name, size))
    parts.append(max(passes, key=lambda p: p[1]))  # the policy's where they tie
    return Phase("log-prob passes", tuple(parts))


def _no_grad_pass(shape: ModelShape, s: Settings, compute_bytes: int) -> tuple[str, int]:
    """The working memory of one model's no-grad pass over `s.logprob`, named by what peaks."""
    t = s.logprob
    layer = t.local * (3 * shape.intermediate_size + 4 * shape.hidden_size) * compute_bytes
    layer += t.mask * (1 + compute_bytes)             # the bool mask and sdpa's copy in the compute dtype
    layer += 2 * t.local * shape.head_dim * compute_bytes  # rotary's cos and sin, alive through every layer
    layer += exchange_bytes(shape, replace(s, compute_bytes=compute_bytes), t)
    logits, block, more = _logits(shape, s, t, compute_bytes)
    blocks = (LOGPROB_BLOCKS + more) * block
    build = MASK_BUILD * t.mask if t.split > 1 else 0
    return max([("forward working memory", layer), ("logits and log-prob block", logits + blocks),
                ("building the split's mask", build)], key=lambda p: p[1])


def generation_phase(shape: ModelShape, s: Settings) -> Phase:
    """Generation: the trainer's resident memory beside the engine (or the hf backend's KV cache)."""
    parts = resident(shape, s, training=False, generating=True)
    if s.generation_bytes:
        parts.append(("generation KV cache and logits (hf or paged)", s.generation_bytes))
    return Phase("generation", tuple(parts))


def phases(shape: ModelShape, s: Settings) -> tuple[Phase, ...]:
    return generation_phase(shape, s), logprob_phase(shape, s), training_phase(shape, s)

"""The answer canvases of a decode call as device tensors: what the device step plans from and commits into.

One row per slot (sequence). Per cell: its token (-1 while masked; the end token, then EOS padding after the
answer's end) and the confidence it was committed with; per position: the model input id. Everything is
updated with tensor operations in place, so a step that reads and writes the canvas can be captured once and
replayed as a CUDA graph, and the host never has to wait for it (it reads copies of the canvas a step later).

The semantics are those of the host reference, engine/sequence.py (SequenceState.commit, which also explains
the two end rules): a commit fixes tokens into masked cells before the answer's end, except the [MASK] id,
which leaves its cell masked; `end` is the first committed end token (EOS or end of turn). Under the stop rule
every cell after it becomes padding and tokens committed after it are dropped; under the official rule the
later cells stay masked and are decoded on. A fixed-schedule method sets max_steps: after that many steps no
cell of the slot is left to decode.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flash_dllm.kernels.canvas_commit import CanvasCommit

NOT_NEW = 1 << 40  # newly_rank of a cell not committed by the previous step
UNLIMITED = 1 << 40  # max_steps of a method that decodes until no cell is masked


@dataclass
class DeviceCanvas:
    tokens: torch.Tensor  # [S, L + 1] int64 model input ids; column L is a dump for out-of-range writes
    answer: torch.Tensor  # [S, G] int64: -1 masked, else the token (EOS for padding after the end)
    confidence: torch.Tensor  # [S, G] float64 confidence each cell was committed with
    prompt_len: torch.Tensor  # [S] int64
    gen_len: torch.Tensor  # [S] int64 (cells at or past it are not part of the answer)
    end: torch.Tensor  # [S] int64 cell of the committed end token; gen_len while there is none
    newly_rank: torch.Tensor  # [S, G] int64 order in which the previous step committed a cell, else NOT_NEW
    seed: torch.Tensor  # [S] int64 sampling seed
    steps: torch.Tensor  # [S] int64 steps this sequence took part in
    forward_passes: torch.Tensor  # [S] int64 (draft and verify passes)
    verify_passes: torch.Tensor  # [S] int64
    accepted: torch.Tensor  # [S] int64 drafts accepted by Flash-Verify
    rejected: torch.Tensor  # [S] int64
    active: torch.Tensor  # [S] bool: still decoding (not done, not cancelled)
    threshold: torch.Tensor  # [S] float64 commit threshold (fast-dllm, flash-cache)
    gamma: torch.Tensor  # [S] float64 Flash-Verify acceptance threshold
    temperature: torch.Tensor  # [S] float64 sampling temperature (used when the call samples)
    end_ids: torch.Tensor  # [E] int64 tokens that end the answer
    official_end: torch.Tensor  # [S] bool: the official end rule (no padding after the end), else stop
    max_steps: torch.Tensor  # [S] int64 steps of a fixed-schedule method (UNLIMITED otherwise)
    mask_id: int
    eos_id: int
    commit_kernel: CanvasCommit = field(default_factory=lambda: CanvasCommit("torch"))
    columns: torch.Tensor | None = None  # [1, G] 0 .. G - 1, made once (an arange per use is a kernel each)
    positions: torch.Tensor | None = None  # [1, L] 0 .. L - 1, likewise

    def __post_init__(self):
        if self.columns is None:
            self.columns = torch.arange(self.answer.shape[1], device=self.answer.device)[None, :]
        if self.positions is None:
            self.positions = torch.arange(self.tokens.shape[1] - 1, device=self.answer.device)[None, :]

    def use_kernels(self, backend: str) -> None:
        """Commit with the Triton kernel ("triton") or its tensor-operation reference ("torch")."""
        if backend != self.commit_kernel.backend:
            self.commit_kernel = CanvasCommit(backend)

    @classmethod
    def allocate(cls, n_slots: int, slot_len: int, width: int, mask_id: int, eos_id: int, end_ids,
                 device) -> "DeviceCanvas":
        """Buffers for n_slots sequences of at most slot_len positions and width answer cells, all inactive.
        `load` fills them in place, so a step captured as a CUDA graph can be replayed for every call."""
        def ints(*shape, fill=0):
            return torch.full(shape, fill, dtype=torch.int64, device=device)

        def floats(*shape):
            return torch.zeros(shape, dtype=torch.float64, device=device)

        return cls(
            tokens=ints(n_slots, slot_len + 1, fill=eos_id), answer=ints(n_slots, width, fill=eos_id),
            confidence=torch.zeros((n_slots, width), dtype=torch.float64, device=device),
            prompt_len=ints(n_slots), gen_len=ints(n_slots), end=ints(n_slots),
            newly_rank=ints(n_slots, width, fill=NOT_NEW),
            seed=ints(n_slots), steps=ints(n_slots), forward_passes=ints(n_slots), verify_passes=ints(n_slots),
            accepted=ints(n_slots), rejected=ints(n_slots),
            active=torch.zeros(n_slots, dtype=torch.bool, device=device),
            threshold=floats(n_slots), gamma=floats(n_slots), temperature=floats(n_slots),
            end_ids=torch.tensor(sorted(end_ids), dtype=torch.int64, device=device),
            official_end=torch.zeros(n_slots, dtype=torch.bool, device=device), max_steps=ints(n_slots, fill=UNLIMITED),
            mask_id=mask_id, eos_id=eos_id)

    def load(self, prompts: list[list[int]], gen_lengths: list[int], seeds: list[int], threshold: float = 0.9,
             gamma: float = 0.8, temperature: float = 0.0) -> None:
        """Start a sequence in each of the first len(prompts) slots (the others become empty), in place."""
        self.active.zero_()
        self.prompt_len.zero_()
        self.gen_len.zero_()
        self.end.zero_()
        self.answer.fill_(self.eos_id)
        self.tokens.fill_(self.eos_id)
        for row, (prompt, gen, seed) in enumerate(zip(prompts, gen_lengths, seeds)):
            self.load_slot(row, prompt, gen, seed, threshold, gamma, temperature)

    def load_slot(self, slot: int, prompt: list[int], gen_length: int, seed: int, threshold: float, gamma: float,
                  temperature: float) -> None:
        """Start one sequence in `slot` while the others keep their state (continuous batching); in place."""
        L, width = self.slot_len, self.width
        if len(prompt) + gen_length > L or gen_length > width:
            raise ValueError(f"a sequence of {len(prompt)} + {gen_length} tokens does not fit a slot of {L}")
        tokens = torch.full((L + 1,), self.eos_id, dtype=torch.int64)
        tokens[: len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
        tokens[len(prompt): len(prompt) + gen_length] = self.mask_id
        answer = torch.full((width,), self.eos_id, dtype=torch.int64)
        answer[:gen_length] = -1
        self.tokens[slot].copy_(tokens)
        self.answer[slot].copy_(answer)
        for buffer, value in ((self.prompt_len, len(prompt)), (self.gen_len, gen_length), (self.end, gen_length),
                              (self.seed, seed & 0xFFFFFFFF), (self.threshold, threshold), (self.gamma, gamma),
                              (self.temperature, temperature), (self.steps, 0), (self.forward_passes, 0),
                              (self.verify_passes, 0), (self.accepted, 0), (self.rejected, 0), (self.active, True)):
            buffer[slot] = value
        self.confidence[slot].zero_()
        self.newly_rank[slot].fill_(NOT_NEW)

    def retire(self, slot: int) -> None:
        """Stop decoding `slot` (cancelled): later steps leave it alone."""
        self.active[slot] = False

    @property
    def n_slots(self) -> int:
        return self.answer.shape[0]

    @property
    def width(self) -> int:
        return self.answer.shape[1]

    @property
    def slot_len(self) -> int:
        return self.tokens.shape[1] - 1

    def cells(self) -> torch.Tensor:
        return self.columns

    def limit(self) -> torch.Tensor:
        """[S] cells at or past this index are padding or outside the answer."""
        return torch.where(self.official_end, self.gen_len, torch.minimum(self.end + 1, self.gen_len))

    def masked(self) -> torch.Tensor:
        """[S, G] cells still to decode (masked, before the limit, while the schedule has steps left)."""
        live = (self.cells() < self.limit()[:, None]) & (self.steps < self.max_steps)[:, None]
        return (self.answer < 0) & live

    def total_len(self) -> torch.Tensor:
        return self.prompt_len + self.gen_len

    def begin_step(self) -> None:
        """A new step's commits start a new 'committed by the previous step' set."""
        self.newly_rank.fill_(NOT_NEW)

    def commit(self, cells: torch.Tensor, tokens: torch.Tensor, confidences: torch.Tensor, chosen: torch.Tensor,
               rank_base: torch.Tensor | None = None) -> torch.Tensor:
        """Commit tokens[s, j] into cells[s, j] where chosen[s, j] (cells -1 = no cell), in list order j.

        Like the reference's loop: a cell that is not masked or lies past the answer's end (stop rule) is
        skipped, and so is a [MASK] token; the first end token ends the answer (an earlier end cell wins) and,
        under the stop rule, every cell after it becomes padding. Returns [S] how many cells each row
        committed (the next commit's rank_base, so newly_rank keeps commit order). One kernel on the GPU
        (kernels/canvas_commit.py holds the contract and the tensor-operation reference).
        """
        return self.commit_kernel(
            self.answer, self.confidence, self.newly_rank, self.end, self.tokens, cells, tokens,
            confidences, chosen, rank_base, self.active, self.official_end, self.gen_len, self.prompt_len,
            self.steps, self.max_steps, self.end_ids, mask_id=self.mask_id, eos_id=self.eos_id, not_new=NOT_NEW)

    def finish_step(self) -> None:
        """Count the step for the sequences that took part and retire the ones with nothing left to decode."""
        self.steps += self.active.long()
        self.active &= self.masked().any(1)


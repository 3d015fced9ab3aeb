"""The diffusion canvas as the UI sees it: folded from engine events, rendered to HTML, replayable.

The engine reports, per step, only the cells that changed (committed cells with their display pieces and
confidences, the window it looked at, Flash-Verify drafts and their verdicts, where EOS padding starts).
`Canvas.apply` folds one such event in O(changed cells) and marks those cells dirty; `Canvas.render` re-renders
only dirty cells and joins cached fragments, so a frame costs a string join however many steps it covers.
Nothing here decodes tokens: pieces come from the engine.

Cell classes (assets/canvas.css): ``m`` masked, ``c`` committed (``--t`` = step it committed, ``--c`` =
confidence; the frame's ``--n`` = current step, so the colour says *when* relative to now), ``e`` the end
token, ``p`` EOS padding, ``w`` in the current window, ``f`` committed this step, ``a`` accepted draft,
``r`` rejected draft (the masked cell shows the rejected piece struck through), ``b`` first cell of a block,
``x`` a committed cell of a completed block of block diffusion (cached once, never recomputed).

Block diffusion aligns its blocks to absolute positions, so the answer's first block may be short: its first
step's window (every cell of the first block, all still masked) says where the blocks start.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from flash_dllm.engine import COMMITTED, MASKED, PADDING, CanvasStart, StepEvent

CELL_CLASS = {MASKED: "m", COMMITTED: "c", PADDING: "p"}  # a cell state's class in assets/canvas.css
_VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍", " ": "␣"}


def display_piece(piece: str) -> str:
    """Make a token piece visible in one cell: control characters as symbols, a lone space as ␣."""
    if piece in _VISIBLE:
        return _VISIBLE[piece]
    if piece == "":
        return "∅"
    out = []
    for ch in piece:
        code = ord(ch)
        if ch == "\n":
            out.append("↵")
        elif code < 0x20:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("␡")
        else:
            out.append(ch)
    return "".join(out)


@dataclass
class Canvas:
    """One sequence's answer canvas. ``record`` keeps the events so any step can be replayed."""

    gen_length: int
    block_length: int
    prompt_tail: list[str]
    method: str
    record: bool = True
    label: str = ""
    pieces: list[str] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    commit_step: list[int] = field(default_factory=list)
    state: list[str] = field(default_factory=list)
    padding_from: int | None = None
    steps: int = 0  # steps applied so far
    window: set = field(default_factory=set)
    fresh: set = field(default_factory=set)
    accepted: set = field(default_factory=set)
    rejected: dict = field(default_factory=dict)  # cell -> rejected draft piece
    events: list[StepEvent] = field(default_factory=list)
    block_phase: int = 0  # blocks start at the cells congruent to this (block diffusion: from its first window)
    cached: set = field(default_factory=set)  # committed cells of completed blocks (block diffusion)
    finish_reason: str = ""
    end_tokens: frozenset = frozenset()  # token ids that end the answer (CanvasStart.end_tokens)
    end_at: int | None = None  # the earliest committed cell holding one of them
    _fragments: list[str] = field(default_factory=list, repr=False)
    _dirty: set = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        n = self.gen_length
        self.pieces = [""] * n
        self.confidence = [0.0] * n
        self.commit_step = [-1] * n
        self.state = [MASKED] * n
        self._fragments = [""] * n
        self._dirty = set(range(n))

    @classmethod
    def from_start(cls, start: CanvasStart, record: bool = True, label: str = "") -> "Canvas":
        return cls(start.gen_length, start.block_length, list(start.prompt_tail), start.method, record, label,
                   end_tokens=frozenset(start.end_tokens))

    # ------------------------------------------------------------------ folding
    def apply(self, event: StepEvent) -> None:
        """Fold one step; touches only the cells the event names plus the previous step's transient marks."""
        dirty = self._dirty
        dirty |= self.window | self.fresh | self.accepted | set(self.rejected)
        self.window = set(event.window)
        self.fresh = set(event.committed)
        self.accepted = set(event.accepted)
        rejected = set(event.rejected)
        self.rejected = {c: p for c, p in zip(event.drafted, event.draft_pieces) if c in rejected}
        dirty |= self.window | self.fresh | self.accepted | set(self.rejected)
        tokens = event.tokens if len(event.tokens) == len(event.committed) else [None] * len(event.committed)
        for cell, piece, conf, token in zip(event.committed, event.pieces, event.confidences, tokens):
            if 0 <= cell < self.gen_length and self.state[cell] != PADDING:
                self.pieces[cell] = piece
                self.confidence[cell] = conf
                self.commit_step[cell] = event.step
                self.state[cell] = COMMITTED
                if token in self.end_tokens and (self.end_at is None or cell < self.end_at):
                    if self.end_at is not None:
                        dirty |= set(range(cell, self.end_at + 1))  # the old end and the cells between
                    else:
                        dirty |= set(range(cell, self.gen_length))
                    self.end_at = cell
        if event.padding_from is not None and (self.padding_from is None or event.padding_from < self.padding_from):
            start = max(0, event.padding_from)
            for cell in range(start, self.padding_from if self.padding_from is not None else self.gen_length):
                self.state[cell] = PADDING
                dirty.add(cell)
            if start > 0:
                dirty.add(start - 1)  # the end token's cell changes class
            self.padding_from = start
        if self.method.startswith("block-diffusion"):
            self._follow_blocks(event)
        self.steps = event.step + 1
        if self.record:
            self.events.append(event)

    def _block_of(self, cell: int) -> range:
        start = cell - (cell - self.block_phase) % self.block_length
        return range(max(start, 0), min(start + self.block_length, self.gen_length))

    def _follow_blocks(self, event: StepEvent) -> None:
        """Block diffusion: learn where blocks start (first step), and mark the blocks this step completed."""
        if event.step == 0 and event.window:
            self.block_phase = (max(event.window) + 1) % self.block_length
            self._dirty |= set(range(self.gen_length))
        for cell in {block.start for block in map(self._block_of, event.committed)}:
            block = self._block_of(cell)
            if all(self.state[c] != MASKED for c in block):
                done = {c for c in block if self.state[c] == COMMITTED}
                self.cached |= done
                self._dirty |= done

    def finish(self, reason: str) -> None:
        """The sequence is done: the window of its last step is no longer one (its outline would stay drawn
        over padding cells)."""
        self.finish_reason = reason
        self._dirty |= self.window
        self.window = set()

    def apply_all(self, events) -> None:
        for event in events:
            self.apply(event)

    @property
    def committed_cells(self) -> int:
        return sum(1 for s in self.state if s == COMMITTED)

    @property
    def masked_cells(self) -> int:
        return sum(1 for s in self.state if s == MASKED)

    @property
    def padding_cells(self) -> int:
        return sum(1 for s in self.state if s == PADDING)

    @property
    def end_cell(self) -> int | None:
        """The cell of the end token that ends the answer (None while none is committed)."""
        return self.padding_from - 1 if self.padding_from is not None and self.padding_from > 0 else self.end_at

    def answer_preview(self) -> str:
        """The committed prefix of the answer (pieces up to the first masked cell or the end token; under the
        official end rule the cells after the end token decode on, but are no part of the answer)."""
        out = []
        stop = self.gen_length if self.padding_from is None else max(0, self.padding_from - 1)
        if self.end_at is not None:
            stop = min(stop, self.end_at)
        for cell in range(stop):
            if self.state[cell] != COMMITTED:
                break
            out.append(self.pieces[cell])
        return "".join(out)

    # ------------------------------------------------------------------ replay
    def at_step(self, step: int) -> "Canvas":
        """A fresh canvas with the first ``step`` recorded steps applied (0 = all masked)."""
        step = max(0, min(step, len(self.events)))
        replay = Canvas(self.gen_length, self.block_length, self.prompt_tail, self.method, record=False,
                        label=self.label, end_tokens=self.end_tokens)
        replay.apply_all(self.events[:step])
        if step == len(self.events) and self.finish_reason:
            replay.finish(self.finish_reason)
        return replay

    # ------------------------------------------------------------------ rendering
    def cell_fragment(self, cell: int) -> str:
        state = self.state[cell]
        classes = ["k", CELL_CLASS[state]]
        if (cell - self.block_phase) % self.block_length == 0 and cell:
            classes.append("b")
        if cell in self.cached:
            classes.append("x")
        if cell in self.window:
            classes.append("w")
        style, title, text = "", "", ""
        if state == COMMITTED:
            end = self.end_cell
            end_cell = cell == end
            if end_cell:
                classes.append("e")
            elif end is not None and cell > end:
                classes.append("z")  # decoded after the end token (official end rule): not in the answer
            if cell in self.fresh:
                classes.append("f")
            if cell in self.accepted:
                classes.append("a")
            conf = self.confidence[cell]
            style = f' style="--t:{self.commit_step[cell]};--c:{conf:.2f}"'
            after = end is not None and cell > end
            title = f"#{cell} step {self.commit_step[cell]} p={conf:.2f}" + (
                f" end {display_piece(self.pieces[cell])}" if end_cell else "") + (
                " after the end (not in the answer)" if after else "") + (
                " (block cached)" if cell in self.cached else "")
            # the end token shows as the legend's ⏎ (its own piece, often a long special token, in the title)
            text = "⏎" if end_cell else html.escape(display_piece(self.pieces[cell]))
        elif state == PADDING:
            title = f"#{cell} EOS padding"
        else:
            if cell in self.rejected:
                classes.append("r")
                text = html.escape(display_piece(self.rejected[cell]))
                title = f"#{cell} masked; draft rejected"
            else:
                title = f"#{cell} masked"
        return f'<i class="{" ".join(classes)}"{style} title="{html.escape(title)}">{text}</i>'

    def cell_fragments(self) -> list[str]:
        """Per-cell HTML, re-rendering only cells changed since the last call."""
        for cell in self._dirty:
            self._fragments[cell] = self.cell_fragment(cell)
        self._dirty = set()
        return self._fragments

    def header(self) -> str:
        status = {"": "decoding", "eos": "done", "length": "done (length)", "cancelled": "stopped"}.get(
            self.finish_reason, self.finish_reason)
        label = f"{html.escape(self.label)} · " if self.label else ""
        return (f'<div class="fd-head">{label}<b>{html.escape(self.method)}</b> · step {self.steps} · '
                f"{self.committed_cells}/{self.gen_length} committed · {self.masked_cells} masked · "
                f"{self.padding_cells} padding{self._end_note()} · <span class=\"fd-status\">{status}</span></div>")

    def _end_note(self) -> str:
        """Under the official end rule no cell becomes padding: say where the answer ended."""
        if self.end_at is None or self.padding_from is not None:
            return ""
        return f" · answer ends at #{self.end_at}"

    def prompt_html(self) -> str:
        tail = "".join(html.escape(display_piece(p)) for p in self.prompt_tail)
        return f'<span class="fd-prompt" title="end of the prompt">…{tail}</span>'

    def render(self) -> str:
        cells = "".join(self.cell_fragments())
        return (f'<div class="fd-canvas" data-step="{self.steps}" data-masked="{self.masked_cells}" '
                f'style="--n:{max(self.steps, 1)}">{self.header()}<div class="fd-cells">{self.prompt_html()}'
                f"{cells}</div>{legend(self.method, self.end_at is not None and self.padding_from is None)}</div>")


_LEGEND_ENTRIES = (
    '<i class="k m"></i>masked <i class="k c" style="--t:0;--c:.9">a</i>'
    '<i class="k c" style="--t:1;--c:.9">b</i>committed (early → late, pale = unsure) '
    '<i class="k c f" style="--t:1;--c:.9">n</i>this step <i class="k m w"></i>window '
    '<i class="k c a" style="--t:1;--c:.9">d</i>draft accepted <i class="k m r">x</i>draft rejected '
    '<i class="k c e" style="--t:1;--c:.9">⏎</i>end <i class="k p"></i>EOS padding '
)
_AFTER_END_ENTRY = '<i class="k c z" style="--t:1;--c:.9">z</i>after the end (decoded, not in the answer) '
_BLOCK_CACHED_ENTRY = '<i class="k c x" style="--t:1;--c:.9">k</i>block cached (block diffusion)'
# Every entry (an exported canvas replays any step, so it shows them all).
LEGEND = f'<div class="fd-legend">{_LEGEND_ENTRIES}{_AFTER_END_ENTRY}{_BLOCK_CACHED_ENTRY}</div>'


def legend(method: str, after_end: bool) -> str:
    """The legend of a live canvas: only the entries its method can show."""
    extra = (_AFTER_END_ENTRY if after_end else "") + (_BLOCK_CACHED_ENTRY if method.startswith("block-diffusion")
                                                       else "")
    return f'<div class="fd-legend">{_LEGEND_ENTRIES}{extra}</div>'


def empty_canvas_html(message: str = "The canvas appears here while an answer is decoded.") -> str:
    return f'<div class="fd-canvas fd-idle"><div class="fd-head">{html.escape(message)}</div></div>'

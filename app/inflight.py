"""The page's list of requests in flight: every engine request (this page's chats, other pages', the API's),
as `Engine.requests_in_flight` reports them, refreshed by a timer (app/ui.py)."""
from __future__ import annotations

import html
import time
from dataclasses import dataclass

TITLE = "Requests in flight"
COLUMNS = ("#", "from", "status", "prompt", "answer", "age")


@dataclass
class InFlightRow:
    id: int
    source: str  # "page", "API", or "–" for a request the app did not label (a script using the engine itself)
    status: str  # "running", or "waiting (for what)"
    prompt_tokens: int
    answer: str  # "generated / length" tokens
    age_s: float

    def cells(self) -> tuple[str, ...]:
        return (str(self.id), self.source, self.status, str(self.prompt_tokens), self.answer, f"{self.age_s:.1f} s")


def inflight_rows(infos, labels: dict[int, str], now: float | None = None) -> list[InFlightRow]:
    """Rows for the RequestInfos not done yet, oldest first."""
    now = time.monotonic() if now is None else now
    rows = []
    for info in sorted(infos, key=lambda i: i.submitted_s):
        if info.status == "done":
            continue
        status = info.status if info.status != "waiting" or not info.waiting_for else f"waiting for {info.waiting_for}"
        rows.append(InFlightRow(info.id, labels.get(info.id, "–"), status, info.prompt_tokens,
                                f"{info.generated_tokens} / {info.gen_length}", max(0.0, now - info.submitted_s)))
    return rows


def inflight_table(rows: list[InFlightRow]) -> str:
    head = f'<div class="fd-head">{TITLE} ({len(rows)})</div>'
    if not rows:
        return f'<div class="fd-stats" id="inflight-list">{head}<div class="fd-note">None: the engine is idle.</div></div>'
    header = "".join(f"<th>{html.escape(name)}</th>" for name in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row.cells()) + "</tr>"
                   for row in rows)
    return f'<div class="fd-stats" id="inflight-list">{head}<table><tr>{header}</tr>{body}</table></div>'


def inflight_html(ctx) -> str:
    """The table for the app context's loaded engine (empty while none is loaded)."""
    engine = ctx.host.engine
    infos = engine.requests_in_flight() if engine is not None else []
    return inflight_table(inflight_rows(infos, dict(ctx.host.request_labels)))

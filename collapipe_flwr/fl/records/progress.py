"""What a person watching a run sees on the server: one line when a round starts (who trains, and why any
CU sits out), a line every ``interval_s`` while it trains (steps done per CU, counted by the decoder's data
plane), and one line when it ends (loss, metric, modelled and measured time).

Lines go to stderr through rich without wrapping (``soft_wrap``): a captured stream (``flwr run --stream``,
a sweep job's log) keeps one line per event whatever the terminal width.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from rich.console import Console
from rich.markup import escape

StepCounter = Callable[[], Mapping[int, int]]  # {cluster n: data-plane steps served so far in the run}
# At most this many CUs are named one by one in a console line (plans, sit-out reasons, steps, failures); the
# rest are counted, and rounds.jsonl keeps every CU's detail. A run of N = 1000 clusters printed one 58 KB line
# per round before.
SHOWN_CUS = 8


def capped(items: Sequence[str], noun: str, sep: str = ", ") -> str:
    """The first :data:`SHOWN_CUS` of ``items`` joined by ``sep``, then ``... and k more <noun> (in rounds.jsonl)``."""
    more = len(items) - SHOWN_CUS
    return sep.join(items[:SHOWN_CUS]) + (f"{sep}... and {more} more {noun} (in rounds.jsonl)" if more > 0 else "")


def segment_text(n: int, S: int, m: int, delta: Sequence[int]) -> str:
    """``CU 0 S=2 m=8 [2,1,0,0]``: cluster n's plan for the round: S stages, m micro-batches, delta_k per device."""
    return f"CU {n} S={int(S)} m={int(m)} [{','.join(str(int(d)) for d in delta)}]"


class RoundProgress:
    """Prints ``round t/T`` with the selected CUs and the reasons for the others, progress during the
    round, then the round's loss, metric and delays."""

    def __init__(
        self,
        num_rounds: int,
        metric_name: str,
        console: Console | None = None,
        interval_s: float = 15.0,
        steps_per_round: int = 0,
    ) -> None:
        self.num_rounds = num_rounds
        self.metric_name = metric_name
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.interval_s = float(interval_s)
        self.steps_per_round = int(steps_per_round)
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def round_started(
        self,
        t: int,
        selected: list[int],
        left_out: Mapping[int, str] | None = None,
        steps_of: StepCounter | None = None,
        segments: Mapping[int, tuple[int, int, Sequence[int]]] | None = None,
    ) -> None:
        """Round t begins with the CUs in ``selected``; ``left_out`` says why the others sit out;
        ``steps_of`` (the decoder's per-CU step counter) drives the in-round progress lines; ``segments``
        {n: (S, m, delta)} is each selected CU's plan, printed as ``CU 0 S=2 m=8 [2,1,0,0]``."""
        named = str(selected) if len(selected) <= SHOWN_CUS else f"{len(selected)} CUs"
        text = f"[bold]round {t}/{self.num_rounds}[/bold] training CUs {named}"
        if segments:
            text += ": " + capped([segment_text(n, *segments[n]) for n in selected if n in segments], "plans")
        if left_out:
            reasons = [f"CU {n} sits out: {escape(reason)}" for n, reason in sorted(left_out.items())]
            text += "; " + capped(reasons, "CUs sit out", sep="; ")
        self.console.print(text)
        self._stop_ticker()
        if self.interval_s > 0:
            self._stop = threading.Event()
            self._ticker = threading.Thread(
                target=self._tick, args=(t, list(selected), steps_of, self._stop), name="round-progress", daemon=True
            )
            self._ticker.start()

    def progress_line(self, t: int, selected: list[int], done: Mapping[int, int], elapsed_s: float) -> str:
        """``round t/T: CU 0 12/40 steps, CU 1 10/40 steps (31 s)`` (no step counts: elapsed time only)."""
        of = f"/{self.steps_per_round}" if self.steps_per_round else ""
        if done and len(selected) > SHOWN_CUS:  # many CUs: the spread, not each one
            counts = [int(done.get(n, 0)) for n in selected]
            text = f"{len(selected)} CUs {min(counts)}-{max(counts)}{of} steps, {sum(counts)} in all"
            return f"round {t}/{self.num_rounds}: {text} ({elapsed_s:.0f} s)"
        parts = [f"CU {n} {int(done.get(n, 0))}{of} steps" for n in selected] if done else ["training"]
        return f"round {t}/{self.num_rounds}: {', '.join(parts)} ({elapsed_s:.0f} s)"

    def _tick(self, t: int, selected: list[int], steps_of: StepCounter | None, stop: threading.Event) -> None:
        start = time.monotonic()
        base = dict(steps_of()) if steps_of is not None else {}
        while not stop.wait(self.interval_s):
            done = {}
            if steps_of is not None:
                now = steps_of()
                done = {n: int(now.get(n, 0)) - int(base.get(n, 0)) for n in selected}
            self.console.print(self.progress_line(t, selected, done, time.monotonic() - start))

    def _stop_ticker(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5.0)
            self._ticker = None

    def round_finished(self, t: int, record: dict) -> None:
        self._stop_ticker()
        loss = record.get("train_loss")
        metric = record.get(f"val_{self.metric_name}")
        modelled = (record.get("modelled") or {}).get("round_delay_s")
        wall = (record.get("measured_s") or {}).get("round_s")
        parts = [f"round {t}/{self.num_rounds} done"]
        if loss is not None:
            parts.append(f"train loss {loss:.4f}")
        if metric is not None:
            parts.append(f"val {self.metric_name} {metric:.4f}")
        if modelled is not None:
            parts.append(f"modelled delay {modelled:.2f} s")
        virtual = (record.get("virtual") or {}).get("round_s")
        if virtual is not None:
            parts.append(f"virtual {virtual:.2f} s")
        if wall is not None:
            parts.append(f"wall {wall:.1f} s")
        overhead = (record.get("measured_s") or {}).get("overhead_s")
        if overhead is not None:
            parts.append(f"overhead {overhead:.2f} s")
        failures = record.get("failures") or []
        if failures:
            said = [f"CU {f.get('cluster')}: {f.get('error', '')}" for f in failures]
            parts.append("failed: " + capped(said, "failures", sep="; "))
        self.console.print(escape(" | ".join(parts)))

    def close(self) -> None:
        self._stop_ticker()

"""A per-round progress display on the server (rich), one line per round with the headline figures."""

from __future__ import annotations

from rich.console import Console


class RoundProgress:
    """Prints ``round t/T`` with the selected CUs, then the round's loss, metric and delays."""

    def __init__(self, num_rounds: int, metric_name: str, console: Console | None = None) -> None:
        self.num_rounds = num_rounds
        self.metric_name = metric_name
        self.console = console or Console(stderr=True, highlight=False)

    def round_started(self, t: int, selected: list[int]) -> None:
        self.console.print(f"[bold]round {t}/{self.num_rounds}[/bold] training clusters {selected}")

    def round_finished(self, t: int, record: dict) -> None:
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
        if wall is not None:
            parts.append(f"wall {wall:.1f} s")
        overhead = (record.get("measured_s") or {}).get("overhead_s")
        if overhead is not None:
            parts.append(f"overhead {overhead:.2f} s")
        self.console.print(" | ".join(parts))

"""The run's records: its output folder (config.json, rounds.jsonl, summary.json), what one round's record
holds, progress on the console and the run's plots."""

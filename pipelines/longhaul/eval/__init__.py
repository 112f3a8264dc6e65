"""Evaluation: pass^k / pass@k with subsets and bootstrap CIs (pure, `metrics`), and running episodes
against OpenAI-compatible endpoints (`evaluate`)."""

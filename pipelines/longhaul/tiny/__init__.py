"""Tiny local models for the CPU smoke run: tokenizer, chat template, Qwen2 weights and a short warm start."""

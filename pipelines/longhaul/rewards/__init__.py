"""Rewards: the outcome reward, the PRM-Lite process reward (pure rules) and their combination."""

"""Chat rendering shared by training, evaluation and SFT: the policy's thinking mode and its chat template."""

"""What the steps use: data, the tiny model and tokenizer, model loading, checkpoints, ranks."""

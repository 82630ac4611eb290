"""Pieces of the `mtpkit train-tiny` recipe: corpus + tokenizer, model configs, training loops, measurement."""

"""Training of the bundled tiny LLaDA-architecture chat model: data, tokenizer, training loop, evaluation."""

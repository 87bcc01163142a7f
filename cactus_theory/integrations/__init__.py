"""Adapters to the engines users already run: Hugging Face transformers (``integrations.transformers``)
and vLLM (``integrations.vllm``). Each is imported on demand, so the library never needs either."""

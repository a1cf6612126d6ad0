"""Provider adapters behind the provider seam (``qimpl.provider``): ``openai_chat``, an
OpenAI-compatible chat-completions server (R-PROV-1)."""
